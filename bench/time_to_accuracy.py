#!/usr/bin/python3
"""Time to a target test accuracy, side by side: Python PyTorch's best practice, Python PyTorch
with afterburner's default recipe (so that recipe and engine gains are told apart), and
`afterburner train --target-accuracy`, alternating A B C A B C in one run.

    /usr/bin/python3 bench/time_to_accuracy.py [--build build] [--reps 3] [--target 0.91]
        [--max-epochs 10] [--first-seed 0] [--extra "afterburner train flags"]

  python-best    bench/pytorch_train.py: bf16 autocast, DataLoader with 2 workers, SGD lr 0.05
                 momentum 0.9 weight decay 5e-4, batch 128, constant learning rate, no augmentation,
                 evaluated at each epoch's end, up to --max-epochs.
  python-recipe  bench/pytorch_train.py with afterburner's recipe, read from `afterburner train
                 --print-config` (learning rate, schedule over its epochs, warm-up, momentum,
                 Nesterov, weight decay, batch size, augmentation) and its evaluation cadence.
  afterburner    `afterburner train --target-accuracy T` with its defaults (and --extra).

All on the test set, 2 threads; round r seeds every contestant with --first-seed + r, so the
spread covers both the machine's noise and the seed's. A run's figure is its training time until the first evaluation
at or above the target (evaluation excluded, data wait included), and the samples trained by then.
A run that never reaches the target counts as infinitely slow. Prints each contestant's median
with min and max, and python-best's time over each other's, as the median of the per-round ratios.
"""

import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
EVALUATIONS_PER_EPOCH = 8  # afterburner's automatic cadence with a target (src/train/run.cpp)
TRAINING_SAMPLES = 60000


def run_json(command, report):
    result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {shlex.join(command)}\n{result.stderr}")
    return json.loads(Path(report).read_text())


def afterburner_recipe(args):
    """afterburner's resolved defaults, as {field: text}, via --print-config."""
    command = [str(Path(args.build) / "afterburner"), "train", "--print-config", *shlex.split(args.extra)]
    text = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    recipe = {}
    for line in text.splitlines():
        name, _, value = line.partition(" = ")
        recipe[name] = value.strip("'\"")
    return recipe


def python_command(report, target, seed, flags):
    return ["/usr/bin/python3", str(HERE / "pytorch_train.py"), "--model", "cnn", "--precision", "bf16",
            "--threads", "2", "--workers", "2", "--target-accuracy", str(target), "--seed", str(seed),
            "--report", report, *flags]


def python_best(args, seed, report):
    flags = ["--no-augment", "--lr", "0.05", "--batch-size", "128", "--epochs", str(args.max_epochs)]
    return run_json(python_command(report, args.target, seed, flags), report)


def python_recipe(args, recipe, seed, report):
    if recipe["optimizer"] != "sgd" or recipe["accumulate"] != "1" or recipe["schedule"] not in ("cosine", "onecycle"):
        sys.exit(f"python-recipe: bench/pytorch_train.py does not run this recipe: {recipe}")
    batch_size = int(recipe["batch_size"])
    eval_every = int(recipe["eval_every"]) or max(1, TRAINING_SAMPLES // batch_size // EVALUATIONS_PER_EPOCH)
    flags = ["--lr", recipe["lr"], "--momentum", recipe["momentum"], "--weight-decay", recipe["weight_decay"],
             "--schedule", recipe["schedule"], "--warmup-steps", recipe["warmup_steps"],
             "--batch-size", str(batch_size), "--epochs", recipe["epochs"], "--eval-every", str(eval_every),
             "--augment" if recipe["augment"] == "true" else "--no-augment"]
    if recipe["nesterov"] == "true":
        flags.append("--nesterov")
    return run_json(python_command(report, args.target, seed, flags), report)


def afterburner(args, seed, report):
    command = [str(Path(args.build) / "afterburner"), "train", "--target-accuracy", str(args.target), "--seed", str(seed),
               "--threads", "2", "--progress", "none", "--report", report, *shlex.split(args.extra)]
    return run_json(command, report)


def seconds_to_target(result):
    seconds = result["train_seconds_to_target"]
    return math.inf if seconds is None else seconds


def spread(values, unit):
    return f"median {statistics.median(values):8.1f}  min {min(values):8.1f}  max {max(values):8.1f} {unit}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.91)
    parser.add_argument("--max-epochs", type=int, default=10, help="python-best's epoch limit")
    parser.add_argument("--first-seed", type=int, default=0, help="round r runs every contestant with seed first+r")
    parser.add_argument("--extra", default="", help="extra flags for afterburner train (and its recipe)")
    args = parser.parse_args()
    recipe = afterburner_recipe(args)
    print(f"afterburner's recipe: lr {recipe['lr']} {recipe['schedule']} over {recipe['epochs']} epochs, "
          f"warm-up {recipe['warmup_steps']} steps, batch {recipe['batch_size']}, momentum {recipe['momentum']}"
          f"{' (Nesterov)' if recipe['nesterov'] == 'true' else ''}, weight decay {recipe['weight_decay']}, "
          f"augmentation {recipe['augment']}, precision {recipe['precision']}")

    contestants = {"python-best": lambda seed, report: python_best(args, seed, report),
                   "python-recipe": lambda seed, report: python_recipe(args, recipe, seed, report),
                   "afterburner": lambda seed, report: afterburner(args, seed, report)}
    seconds = {name: [] for name in contestants}
    samples = {name: [] for name in contestants}
    with tempfile.TemporaryDirectory() as tmp:
        report = str(Path(tmp) / "report.json")
        for rep in range(args.reps):
            for name, run in contestants.items():
                result = run(args.first_seed + rep, report)
                seconds[name].append(seconds_to_target(result))
                samples[name].append(result["samples_to_target"] or math.inf)
                print(f"round {rep + 1} {name:13} {seconds[name][-1]:6.1f} s to {args.target:.0%}, "
                      f"{samples[name][-1]:.0f} samples, final accuracy {result['test_accuracy']:.4f}", flush=True)

    print(f"\ntime to {args.target:.0%} test accuracy (training seconds), {args.reps} rounds")
    for name in contestants:
        print(f"  {name:13} {spread(seconds[name], 's')}   samples median {statistics.median(samples[name]):.0f}")
    for name in ("python-recipe", "afterburner"):
        ratios = [best / other for best, other in zip(seconds["python-best"], seconds[name])]
        print(f"  python-best / {name:13} median {statistics.median(ratios):.2f}x  "
              f"min {min(ratios):.2f}x  max {max(ratios):.2f}x (round by round)")


if __name__ == "__main__":
    main()
