#!/usr/bin/python3
"""Ablation of `afterburner train`: the default configuration against one technique switched
off (or one setting changed) at a time, in interleaved rounds so every variant sees the same
machine. Prints a Markdown table per precision: median training samples/s with min and max,
the median of the round-by-round ratios to the default, and peak resident memory.

    /usr/bin/python3 bench/ablation.py [--build build] [--reps 3] [--precisions fp32,bf16]
        [--model cnn] [--epochs 1] [--only FLAG,...] [--extra-flags "--max-steps 105 --no-augment"]

--model takes zoo names, TorchScript files, or architectures of tests/python/image_models.py
(written to a temporary file as bench/architectures_train.py writes them), comma-separated: one
table each. --only keeps the default and the variants whose flags include one of those given;
--extra-flags go to every variant (without --no-augment among them, every run augments, as the
figures of BENCHMARKS.md's ablation were measured). The jemalloc row needs Debian's libjemalloc2
and is skipped without it.
"""

import argparse
import os
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

from architectures_train import save_model
from train_vs_pytorch import run_json

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))
import image_models  # noqa: E402  (found through the path above)

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
    ("weights cast by autocast at every step (`--no-bf16-weights`)", ["--no-bf16-weights"], {}),
    ("1 intra-op thread (`--threads 1`)", ["--threads", "1"], {}),
    ("OpenMP threads sleep when idle (`OMP_WAIT_POLICY=passive`)", [], {"OMP_WAIT_POLICY": "passive"}),
    ("OpenMP threads pinned to cores (`OMP_PROC_BIND=close`)", [], {"OMP_PROC_BIND": "close"}),
    ("jemalloc (`LD_PRELOAD=libjemalloc.so.2`)", [], {"LD_PRELOAD": str(JEMALLOC)}),
]


def train(args, model, precision, flags, env, report):
    extra = shlex.split(args.extra_flags)
    augment = [] if "--no-augment" in extra else ["--augment"]  # the loader's full work, as measured before
    command = [str(Path(args.build) / "afterburner"), "train", "--model", model, "--precision", precision,
               "--epochs", str(args.epochs), "--progress", "none", "--report", report] + augment + extra + flags
    return run_json(command, report, env={**os.environ, **env})


def chosen_variants(args):
    variants = [v for v in VARIANTS if JEMALLOC.exists() or "LD_PRELOAD" not in v[2]]
    if not args.only:
        return variants
    wanted = args.only.split(",")
    return variants[:1] + [v for v in variants[1:] if any(flag in v[1] for flag in wanted)]


def ablate(args, label, model, variants, tmp):
    report = str(Path(tmp) / "report.json")
    for precision in args.precisions.split(","):
        speed = {name: [] for name, _, _ in variants}
        ratio = {name: [] for name, _, _ in variants}
        rss = {name: [] for name, _, _ in variants}
        for _ in range(args.reps):
            for name, flags, env in variants:
                result = train(args, model, precision, flags, env, report)
                speed[name].append(result["train_samples_per_sec"])
                ratio[name].append(speed[name][-1] / speed[variants[0][0]][-1])
                rss[name].append(result["peak_rss_mb"])
        print(f"\n{label} {precision}, {args.reps} rounds ({shlex.join(sys.argv[1:])})\n")
        print("| configuration | samples/s, median (min-max) | vs default, median (min-max) | peak RSS MB |")
        print("| --- | --- | --- | --- |")
        for name, _, _ in variants:
            s, r = speed[name], ratio[name]
            print(f"| {name} | {statistics.median(s):,.0f} ({min(s):,.0f}-{max(s):,.0f}) "
                  f"| {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f}) | {statistics.median(rss[name]):.0f} |")
        sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated flags: the default and the variants with them")
    parser.add_argument("--extra-flags", default="", help="flags for every variant")
    args = parser.parse_args()
    variants = chosen_variants(args)

    with tempfile.TemporaryDirectory() as tmp:
        for model in args.model.split(","):
            path = model
            if model in image_models.MODELS:
                path = str(Path(tmp) / f"{model}.pt")
                save_model(model, path)
            ablate(args, model, path, variants, tmp)


if __name__ == "__main__":
    main()
