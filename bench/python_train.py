#!/usr/bin/python3
"""A Python training loop, plain and with afterburner's Python pieces swapped in, alternating
in one run: bench/pytorch_train.py (the peer of every training benchmark) against itself with
--afterburner PIECES (fuse, loss, optim, heap, loader; jit with --script: see its docstring). Prints training samples/s
(median, min, max), test accuracy and the ratio, pair by pair, per precision.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_train.py [--reps 3] [--precisions fp32,bf16]
        [--pieces all] [--epochs 1] [--max-steps 0] [--script]

Both: cnn, batch 128, SGD lr 0.05 momentum 0.9, weight decay 5e-4, random crop, 2 threads,
torch's DataLoader with 2 workers.
"""

import argparse
import os
import tempfile
from pathlib import Path

from train_vs_pytorch import HERE, compare_alternating, run_json


def peer(args, precision, report, pieces):
    command = ["/usr/bin/python3", str(HERE / "pytorch_train.py"), "--model", "cnn", "--precision", precision,
               "--epochs", str(args.epochs), "--threads", "2", "--workers", "2", "--report", report]
    if args.max_steps:
        command += ["--max-steps", str(args.max_steps)]
    if args.script:
        command += ["--script"]
    if pieces:
        command += ["--afterburner", pieces]
    return run_json(command, report, env=os.environ)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--pieces", default="all", help="what --afterburner swaps in")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=0)
    parser.add_argument("--script", action="store_true", help="both train torch.jit.script(model)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = str(Path(tmp) / "report.json")
        for precision in args.precisions.split(","):
            compare_alternating(f"cnn {precision}", args.reps, ("python", lambda: peer(args, precision, report, "")),
                                (f"python + {args.pieces}", lambda: peer(args, precision, report, args.pieces)))


if __name__ == "__main__":
    main()
