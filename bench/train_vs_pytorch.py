#!/usr/bin/python3
"""`afterburner train` against the same training run in Python PyTorch (bench/pytorch_train.py),
alternating A B A B in one run so both see the same machine, then medians, spread and the
ratio of afterburner to PyTorch training samples/s per precision.

    /usr/bin/python3 bench/train_vs_pytorch.py [--build build] [--reps 3] [--precisions fp32,bf16]
        [--model cnn] [--epochs 1] [--batch-size 128] [--max-steps 0] [--extra "--no-channels-last"]

Both runs: batch 128 unless --batch-size, SGD lr 0.05 (constant) momentum 0.9, weight decay 5e-4,
random-crop augmentation, 2 threads, training samples/s over
training steps only (data wait included, evaluation excluded). PyTorch uses its DataLoader with
2 workers; afterburner its own loader with its default worker count.
"""

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_json(command, report, env=None):
    result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {shlex.join(command)}\n{result.stderr}")
    return json.loads(Path(report).read_text())


def afterburner(args, precision, report):
    command = [str(Path(args.build) / "afterburner"), "train", "--model", args.model,
               "--precision", precision, "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
               "--threads", "2", "--progress", "none", "--report", report,
               # bench/pytorch_train.py's recipe, so that both sides do the same work
               "--augment", "--lr", "0.05", "--no-nesterov", "--schedule", "constant"]
    if args.max_steps:
        command += ["--max-steps", str(args.max_steps)]
    return run_json(command + shlex.split(args.extra), report)


def pytorch(args, precision, report):
    command = ["/usr/bin/python3", str(HERE / "pytorch_train.py"), "--model", args.model,
               "--precision", precision, "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
               "--threads", "2", "--workers", "2", "--report", report]
    if args.max_steps:
        command += ["--max-steps", str(args.max_steps)]
    return run_json(command, report)


def spread(values):
    return f"median {statistics.median(values):8.0f}  min {min(values):8.0f}  max {max(values):8.0f}"


def compare_alternating(title, reps, first, second):
    """Runs first() and second() (each returning a report) `reps` times, alternating, and prints
    their training samples/s, test accuracy, and second's ratio to first's, pair by pair.
    first and second are (label, function) pairs."""
    reports = {first[0]: [], second[0]: []}
    for _ in range(reps):
        for label, run in (first, second):
            reports[label].append(run())
    print(f"{title}, {reps} pairs, training samples/s")
    for label, runs in reports.items():
        speeds = [r["train_samples_per_sec"] for r in runs]
        accuracy = statistics.median(r["test_accuracy"] for r in runs)
        print(f"  {label:24s} {spread(speeds)}   test acc {accuracy:.4f}")
    ratios = [b["train_samples_per_sec"] / a["train_samples_per_sec"] for a, b in zip(*reports.values())]
    print(f"  {'ratio':24s} median {statistics.median(ratios):.2f}x  min {min(ratios):.2f}x  max {max(ratios):.2f}x"
          " (pair by pair)")
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--max-steps", type=int, default=0)
    parser.add_argument("--extra", default="", help="extra flags for afterburner train")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        report = str(Path(tmp) / "report.json")
        for precision in args.precisions.split(","):
            ours, theirs, ratios, acc_ours, acc_theirs, rss_ours, rss_theirs = [], [], [], [], [], [], []
            for _ in range(args.reps):
                a = afterburner(args, precision, report)
                b = pytorch(args, precision, report)
                ours.append(a["train_samples_per_sec"])
                theirs.append(b["train_samples_per_sec"])
                ratios.append(ours[-1] / theirs[-1])
                acc_ours.append(a["test_accuracy"])
                acc_theirs.append(b["test_accuracy"])
                rss_ours.append(a["peak_rss_mb"])
                rss_theirs.append(b["peak_rss_mb"] + b.get("peak_rss_children_mb", 0))
            print(f"{args.model} {precision}, {args.reps} pairs, training samples/s")
            print(f"  afterburner  {spread(ours)}   test acc {statistics.median(acc_ours):.4f}"
                  f"   peak RSS {statistics.median(rss_ours):.0f} MB")
            print(f"  pytorch      {spread(theirs)}   test acc {statistics.median(acc_theirs):.4f}"
                  f"   peak RSS {statistics.median(rss_theirs):.0f} MB (main + largest worker)")
            print(f"  ratio        median {statistics.median(ratios):.2f}x  min {min(ratios):.2f}x"
                  f"  max {max(ratios):.2f}x (pair by pair)"
                  f"   peak RSS {statistics.median(rss_ours) / statistics.median(rss_theirs):.0%} of PyTorch's")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
