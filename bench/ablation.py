#!/usr/bin/python3
"""Ablation of `afterburner train`: the default configuration against one technique switched
off (or one setting changed) at a time, in interleaved rounds so every variant sees the same
machine. Prints a Markdown table per precision: median training samples/s with min and max,
the median of the round-by-round ratios to the default, and peak resident memory.

    /usr/bin/python3 bench/ablation.py [--build build] [--reps 3] [--precisions fp32,bf16]
        [--model cnn] [--epochs 1]

The jemalloc row needs Debian's libjemalloc2 and is skipped without it.
"""

import argparse
import os
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

from train_vs_pytorch import run_json

JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")

# (label, extra flags, extra environment); the first is the baseline.
VARIANTS = [
    ("default (every technique on)", [], {}),
    ("fused ops, loss and optimizer off (`--no-fuse`)", ["--no-fuse"], {}),
    ("freed memory returned to the OS (`--no-keep-freed-memory`)", ["--no-keep-freed-memory"], {}),
    ("all of afterburner's techniques off", ["--no-fuse", "--no-keep-freed-memory"], {}),
    ("1 loader worker (`--workers 1`)", ["--workers", "1"], {}),
    ("2 loader workers (`--workers 2`)", ["--workers", "2"], {}),
    ("NCHW (`--no-channels-last`)", ["--no-channels-last"], {}),
    ("1 intra-op thread (`--threads 1`)", ["--threads", "1"], {}),
    ("OpenMP threads sleep when idle (`OMP_WAIT_POLICY=passive`)", [], {"OMP_WAIT_POLICY": "passive"}),
    ("OpenMP threads pinned to cores (`OMP_PROC_BIND=close`)", [], {"OMP_PROC_BIND": "close"}),
    ("jemalloc (`LD_PRELOAD=libjemalloc.so.2`)", [], {"LD_PRELOAD": str(JEMALLOC)}),
]


def train(args, precision, flags, env, report):
    command = [str(Path(args.build) / "afterburner"), "train", "--model", args.model, "--precision", precision,
               "--epochs", str(args.epochs), "--progress", "none", "--report", report,
               "--augment"] + flags  # as BENCHMARKS.md's figures were measured: the loader's full work
    return run_json(command, report, env={**os.environ, **env})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    variants = [v for v in VARIANTS if JEMALLOC.exists() or "LD_PRELOAD" not in v[2]]

    with tempfile.TemporaryDirectory() as tmp:
        report = str(Path(tmp) / "report.json")
        for precision in args.precisions.split(","):
            speed = {label: [] for label, _, _ in variants}
            ratio = {label: [] for label, _, _ in variants}
            rss = {label: [] for label, _, _ in variants}
            for _ in range(args.reps):
                for label, flags, env in variants:
                    result = train(args, precision, flags, env, report)
                    speed[label].append(result["train_samples_per_sec"])
                    ratio[label].append(speed[label][-1] / speed[variants[0][0]][-1])
                    rss[label].append(result["peak_rss_mb"])
            print(f"\n{args.model} {precision}, {args.reps} rounds ({shlex.join(sys.argv[1:])})\n")
            print("| configuration | samples/s, median (min-max) | vs default | peak RSS MB |")
            print("| --- | --- | --- | --- |")
            for label, _, _ in variants:
                s = speed[label]
                print(f"| {label} | {statistics.median(s):,.0f} ({min(s):,.0f}-{max(s):,.0f}) "
                      f"| {statistics.median(ratio[label]):.2f}x | {statistics.median(rss[label]):.0f} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
