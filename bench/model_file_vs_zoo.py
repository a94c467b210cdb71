#!/usr/bin/python3
"""`afterburner train --model cnn.pt` (the cnn written in Python, torch.jit.script'ed and saved)
against `afterburner train --model cnn` (the same architecture from the zoo), alternating in one
run: training samples/s (median, min, max), test accuracy, and the ratio, pair by pair.

    /usr/bin/python3 bench/model_file_vs_zoo.py [--build build] [--reps 3] [--max-steps 0] [--extra "..."]

Both: afterburner's defaults (its recipe, precision auto, fused loss and optimizer, the heap
policy) and one epoch; the zoo model also gets its fused layers, which a TorchScript file cannot.
"""

import argparse
import shlex
import tempfile
from pathlib import Path

import torch

from pytorch_train import build_model
from train_vs_pytorch import compare_alternating, run_json


def train(args, model, report):
    command = [str(Path(args.build) / "afterburner"), "train", "--model", model, "--epochs", "1",
               "--threads", "2", "--progress", "none", "--report", report]
    if args.max_steps:
        command += ["--max-steps", str(args.max_steps)]
    return run_json(command + shlex.split(args.extra), report)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=0)
    parser.add_argument("--extra", default="", help="extra flags for both runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = str(Path(tmp) / "cnn_from_python.pt")
        torch.manual_seed(0)
        torch.jit.script(build_model("cnn")).save(script)
        report = str(Path(tmp) / "report.json")
        compare_alternating("cnn", args.reps, ("zoo cnn", lambda: train(args, "cnn", report)),
                            ("cnn_from_python.pt", lambda: train(args, script, report)))


if __name__ == "__main__":
    main()
