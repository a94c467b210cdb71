#!/usr/bin/python3
"""Test accuracy and trainable parameters of a model trained dense and sketched
(`afterburner train --sketch`), the same run otherwise, alternating dense and sketched per seed.

    /usr/bin/python3 bench/sketch_accuracy.py [--build build] [--model mlp] [--epochs 5]
        [--seeds 3] [--sketch "--sketch-rank 48"] [--extra ""]

Prints each run, then the median test accuracy of each, the difference in points, the ratio of
trainable parameters and the training speed of each.
"""

import argparse
import shlex
import statistics
import tempfile
from pathlib import Path

from train_vs_pytorch import run_json


def train(args, seed, sketch_flags, report):
    command = [str(Path(args.build) / "afterburner"), "train", "--model", args.model, "--epochs", str(args.epochs),
               "--seed", str(seed), "--threads", "2", "--progress", "none", "--report", report]
    return run_json(command + sketch_flags + shlex.split(args.extra), report)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--sketch", default="--sketch-rank 48", help="sketch flags besides --sketch")
    parser.add_argument("--extra", default="", help="extra flags for both runs")
    args = parser.parse_args()

    runs = {"dense": [], "sketched": []}
    flags = {"dense": [], "sketched": ["--sketch"] + shlex.split(args.sketch)}
    with tempfile.TemporaryDirectory() as tmp:
        report = str(Path(tmp) / "report.json")
        for seed in range(args.seeds):
            for kind in ("dense", "sketched"):
                result = train(args, seed, flags[kind], report)
                runs[kind].append(result)
                print(f"seed {seed} {kind:8}  accuracy {result['test_accuracy']:.4f}  "
                      f"parameters {result['trainable_parameters']:9d}  "
                      f"{result['train_samples_per_sec']:8.0f} samples/s", flush=True)

    def median(kind, field):
        return statistics.median(r[field] for r in runs[kind])

    for kind in ("dense", "sketched"):
        accuracies = [r["test_accuracy"] for r in runs[kind]]
        print(f"{kind:8}  accuracy median {median(kind, 'test_accuracy'):.4f} (min {min(accuracies):.4f}, "
              f"max {max(accuracies):.4f})  parameters {runs[kind][0]['trainable_parameters']}  "
              f"{median(kind, 'train_samples_per_sec'):.0f} samples/s")
    points = 100 * (median("dense", "test_accuracy") - median("sketched", "test_accuracy"))
    fewer = runs["dense"][0]["trainable_parameters"] / runs["sketched"][0]["trainable_parameters"]
    print(f"sketched: {points:.2f} points below dense, {fewer:.2f}x fewer trainable parameters")


if __name__ == "__main__":
    main()
