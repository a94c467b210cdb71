#!/usr/bin/python3
"""Training samples/s of real architectures (tests/python/image_models.py: torchvision's with a
one-channel stem, transformers, the model of issue 25), `afterburner train` on the scripted
model file against Python PyTorch's best practice on the same model, alternating in one run;
per model the medians, spread and the ratio pair by pair, then a table and the geometric mean.

    /usr/bin/python3 bench/architectures_train.py [--build build] [--reps 3] [--steps 200 | --epoch]
        [--precision bf16] [--batch-size 128] [--python-channels-last auto] [--python-allocator auto]
        [--afterburner-flags="--channels-last"]
        [--afterburner-side cli|python] [--afterburner-allocator own|tcmalloc]
        [--models resnet18,mobilenet_v3_small,efficientnet_b0,convnext,vision_transformer,residual_attention,rows_transformer]

Each model is built with torch.manual_seed(0), compiled as its user would save it
(image_models.compiled) and written to a temporary file; both sides start from its weights.

  afterburner  `afterburner train --model FILE` with its defaults (SGD lr 0.1 momentum 0.9
               Nesterov, weight decay 5e-4, cosine schedule with warm-up, no augmentation, its
               loader and fused ops), 2 threads, --max-steps (5 + --steps), one epoch.
  afterburner  by default on its own allocator: the tool links tcmalloc, the Python package
               keeps freed memory in glibc's heap (`afterburner.optimize`). --afterburner-allocator
               tcmalloc preloads tcmalloc (LD_PRELOAD, Debian's libtcmalloc-minimal4) for either
               side (for the tool: a build without it linked).
  afterburner  with --afterburner-side python: the Python loop below, its model and optimizer
  (python)     passed through `afterburner.optimize(model, optimizer, dtype=...)` (the fused
               TorchScript forward, FlatSGD, channels_last where the model convolves), what a
               Python user of the package writes; the autocast context stays, as with ipex.
  python       the eager model (the builder's, with the file's weights loaded): what a Python user
               trains. torch.set_num_threads(2); the training images normalised once (mean 0.2860,
               std 0.3530) into one float tensor in memory and batched by indexing a shuffled
               permutation, no DataLoader workers (measured best here); SGD as afterburner's with
               the same schedule (pytorch_train.schedule_factor); cross-entropy;
               torch.autocast("cpu", bfloat16) around forward + loss for bf16 (LayerNorm inputs
               cast to float32 where autocast fails on them, as in torch 1.13); channels_last per
               --python-channels-last and the memory allocator per --python-allocator (auto: every
               combination tried once for 20 steps, the layouts on models with a convolution, the
               fastest kept). PyTorch's CPU tuning guide names the allocator: glibc's default maps and
               unmaps every large block, so each step page-faults its activations anew (up to 2.2x
               for this side: BENCHMARKS.md, "A stronger Python side").

Pair i trains with seed i on both sides (afterburner's --seed; torch.manual_seed on the Python
side once the weights are loaded): each pair draws its own batches and dropout masks, so the test
accuracies of the pairs show the spread that seeds alone make. --epoch trains one whole epoch of
Fashion-MNIST (468 batches of 128, the last partial one dropped on both sides) instead of
--steps: the accuracy comparison, median [min, max] over the pairs in the table.

Both sides are separate processes (the Python one is this script with --python-worker) and both
figures are (--steps * batch) / seconds of the --steps steps after the first 5, which are warm-up
(TorchScript's profiling runs, allocator growth); afterburner's come from its --log-jsonl step
times, the figure over all its steps from its report is printed alongside. Evaluation on the test
set (batch 128, untimed; float32 on the Python side) follows on both sides, as a check that both
trained.

Run it on a quiet machine: under other load, eager PyTorch's OpenMP threads spin-wait for each
other at every small op (seen 150 against 3,700 samples/s with OMP_WAIT_POLICY=passive, at load 5
on 2 cores) while afterburner's barely slow down. The load average is printed at start and end;
environment variables such as OMP_WAIT_POLICY reach both sides.
"""

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from machine import cpu_description, load_description
from pytorch_train import DEFAULT_DATA_DIR, EVAL_BATCH_SIZE, MEAN, STD, load_split, schedule_factor
from train_vs_pytorch import HERE, compare_alternating, run_json

sys.path.insert(0, str(HERE.parent / "tests" / "python"))
import image_models  # noqa: E402  (found through the path above)

DEFAULT_MODELS = ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext", "vision_transformer",
                  "residual_attention", "rows_transformer")
WARMUP_STEPS = 5
TRAIN_SAMPLES = 60_000  # Fashion-MNIST's training set, for --epoch
PROBE_STEPS = 20  # per layout and allocator, for --python-channels-last/--python-allocator auto
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")  # Debian's libtcmalloc-minimal4
# The environment each allocator runs with (either side). glibc-kept keeps freed memory in the
# process as `afterburner train` does with mallopt (the largest mmap threshold glibc takes, no trimming).
ALLOCATORS = {
    "glibc": {},
    "glibc-kept": {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)},
    "tcmalloc": {"LD_PRELOAD": str(TCMALLOC)},
}
THREADS = 2
AFTERBURNER_WARMUP_STEPS = 100  # its --warmup-steps default, so the Python schedule matches it


# ---- the Python side (runs in its own process: this script with --python-worker) ----

def eager_model(name, model_file):
    """The builder's eager model holding the file's weights, so both sides start equal."""
    torch.manual_seed(0)
    model = image_models.MODELS[name][0]()
    model.load_state_dict(torch.jit.load(model_file).state_dict())
    # A trace keeps the evaluation mode it was traced in, and afterburner trains it so.
    return model.train(image_models.MODELS[name][1] == "script")


def autocast_lacks_bf16_layer_norm():
    """True where CPU autocast runs layer_norm on a bfloat16 input with its float32 weight and
    fails (torch 1.13: "expected scalar type BFloat16 but found Float"); later releases cast it."""
    norm = nn.LayerNorm(4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        try:
            norm(torch.zeros(1, 4, dtype=torch.bfloat16))
        except RuntimeError:
            return True
    return False


def layer_norms_in_fp32(model):
    """Feeds every LayerNorm (also torchvision's LayerNorm2d, a subclass) float32 inputs: the usual
    workaround where autocast lacks it, and what newer autocast does by itself."""
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            module.register_forward_pre_hook(lambda _, inputs: tuple(x.float() for x in inputs))


def normalised_images(split):
    images, labels = load_split(DEFAULT_DATA_DIR, split)
    return images.unsqueeze(1).float().div_(255).sub_(MEAN).div_(STD), labels


def shuffled_batches(count, batch_size):
    """Index tensors of full batches over reshuffled epochs, as afterburner's loader (drop_last)."""
    while True:
        order = torch.randperm(count)
        for start in range(0, count - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


def train_python(model, images, labels, args):
    """Trains WARMUP_STEPS + args.steps steps; returns the seconds of the last args.steps and the
    model trained."""
    memory_format = torch.channels_last if args.channels_last == "on" else torch.contiguous_format
    model.to(memory_format=memory_format)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    if args.afterburner_optimize:
        import afterburner  # the package under test, from PYTHONPATH
        dtype = torch.bfloat16 if args.precision == "bf16" else None
        model, optimizer = afterburner.optimize(model, optimizer, dtype=dtype)
    total_steps = WARMUP_STEPS + args.steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: schedule_factor("cosine", step, total_steps, AFTERBURNER_WARMUP_STEPS))
    batches = shuffled_batches(len(labels), args.batch_size)
    start = None
    for step in range(total_steps):
        if step == WARMUP_STEPS:
            start = time.perf_counter()
        index = next(batches)
        batch = images[index].contiguous(memory_format=memory_format)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = F.cross_entropy(model(batch), labels[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
    return time.perf_counter() - start, model


def test_accuracy(model, args):
    """In float32 whatever the precision: it only checks that training worked, and torch 1.13's
    fast attention path (taken in evaluation) fails under bf16 autocast."""
    images, labels = normalised_images("t10k")
    memory_format = torch.channels_last if args.channels_last == "on" else torch.contiguous_format
    model.eval()
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(labels), EVAL_BATCH_SIZE):
            batch = images[start:start + EVAL_BATCH_SIZE].contiguous(memory_format=memory_format)
            correct += (model(batch).argmax(1) == labels[start:start + EVAL_BATCH_SIZE]).sum().item()
    return correct / len(labels)


def python_worker(argv):
    parser = argparse.ArgumentParser(prog="architectures_train.py --python-worker")
    parser.add_argument("--model", required=True)
    parser.add_argument("--model-file", required=True)
    parser.add_argument("--precision", choices=("fp32", "bf16"), required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--channels-last", choices=("on", "off"), required=True)
    parser.add_argument("--evaluate", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--afterburner-optimize", action="store_true")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--report", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)
    model = eager_model(args.model, args.model_file)
    torch.manual_seed(args.seed)  # the batches and dropout masks
    if args.precision == "bf16" and autocast_lacks_bf16_layer_norm() and not args.afterburner_optimize:
        layer_norms_in_fp32(model)  # afterburner's forward is TorchScript's, which runs no Python hooks
    images, labels = normalised_images("train")
    seconds, model = train_python(model, images, labels, args)
    report = {"train_samples_per_sec": args.steps * args.batch_size / seconds,
              "test_accuracy": test_accuracy(model, args) if args.evaluate else None,
              "channels_last": args.channels_last, "torch_version": torch.__version__}
    Path(args.report).write_text(json.dumps(report) + "\n")  # run_json reads it from there
    print(json.dumps(report))


# ---- the driver ----

def python_run(args, name, model_file, settings, report, seed, steps=None, evaluate=True, optimize=False):
    """settings: (channels_last "on" or "off", an ALLOCATORS key)."""
    channels_last, allocator = settings
    command = ["/usr/bin/python3", str(Path(__file__).resolve()), "--python-worker", "--model", name,
               "--model-file", model_file, "--precision", args.precision, "--steps", str(steps or args.steps),
               "--batch-size", str(args.batch_size), "--channels-last", channels_last, "--report", report,
               "--seed", str(seed),
               "--evaluate" if evaluate else "--no-evaluate"] + (["--afterburner-optimize"] if optimize else [])
    package = str((Path(args.build) / "python").resolve())  # the afterburner package built there
    env = {**os.environ, **ALLOCATORS[allocator], **({"PYTHONPATH": package} if optimize else {})}
    return run_json(command, report, env)


def afterburner_python_run(args, name, model_file, report, seed):
    """The Python loop with afterburner.optimize; its figure over all steps is the timed one."""
    # optimize picks the layout and, for training, keeps freed memory; the process starts on glibc's defaults
    allocator = "tcmalloc" if args.afterburner_allocator == "tcmalloc" else "glibc"
    result = python_run(args, name, model_file, ("off", allocator), report, seed, optimize=True)
    return {**result, "all_steps_samples_per_sec": result["train_samples_per_sec"]}


def afterburner_run(args, model_file, report, steps_log, seed):
    command = [str(Path(args.build) / "afterburner"), "train", "--model", model_file, "--seed", str(seed),
               "--precision", args.precision, "--max-steps", str(WARMUP_STEPS + args.steps), "--epochs", "1",
               "--batch-size", str(args.batch_size), "--threads", str(THREADS), "--progress", "none",
               "--report", report, "--log-jsonl", steps_log, "--optimizer", "sgd", *shlex.split(args.afterburner_flags)]
    allocator = "tcmalloc" if args.afterburner_allocator == "tcmalloc" else "glibc"
    result = run_json(command, report, {**os.environ, **ALLOCATORS[allocator]})
    return {"train_samples_per_sec": steady_samples_per_sec(steps_log),
            "all_steps_samples_per_sec": result["train_samples_per_sec"],
            "test_accuracy": result["test_accuracy"]}


def steady_samples_per_sec(steps_log):
    """Samples/s of the steps after the warm-up, from afterburner's per-step log, so that its
    first steps (TorchScript's profiling runs) count as little as in the Python figure."""
    events = [json.loads(line) for line in Path(steps_log).read_text().splitlines() if line.strip()]
    steps = [e for e in events if e["event"] == "step" and e["step"] > WARMUP_STEPS]
    return sum(e["samples"] for e in steps) / sum(e["step_seconds"] for e in steps)


def has_convolution(model):
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def python_settings(args, name, model_file, report):
    """(channels_last, allocator) of the Python side: the options given, and for auto the fastest
    combination over PROBE_STEPS steps (channels_last off without a convolution: the layout only
    changes how convolutions run; tcmalloc only where it is installed)."""
    if args.python_channels_last != "auto":
        layouts = [args.python_channels_last]
    else:
        layouts = ["off", "on"] if has_convolution(image_models.MODELS[name][0]()) else ["off"]
    if args.python_allocator != "auto":
        allocators = [args.python_allocator]
    else:
        allocators = [a for a in ALLOCATORS if a != "tcmalloc" or TCMALLOC.exists()]
    candidates = [(layout, allocator) for layout in layouts for allocator in allocators]
    if len(candidates) == 1:
        return candidates[0]
    probes = {c: python_run(args, name, model_file, c, report, 0, PROBE_STEPS, evaluate=False) for c in candidates}
    speeds = {c: probe["train_samples_per_sec"] for c, probe in probes.items()}
    choice = max(speeds, key=speeds.get)
    tried = ", ".join(f"channels_last {layout} + {allocator} {speed:.0f}" for (layout, allocator), speed in speeds.items())
    print(f"  python: channels_last {choice[0]}, {choice[1]} ({tried} samples/s over {PROBE_STEPS} steps)")
    return choice


def save_model(name, path):
    torch.manual_seed(0)
    image_models.compiled(name, image_models.MODELS[name][0]()).save(path)


def compare_model(args, name, tmp):
    """Alternates Python and afterburner on one model; returns their (python, afterburner) reports
    pair by pair. Python runs first in each pair so that compare_alternating's ratio (second over
    first) is afterburner's over Python's, as in the table."""
    model_file, report, steps_log = (str(Path(tmp) / f) for f in (f"{name}.pt", "report.json", "steps.jsonl"))
    save_model(name, model_file)
    print(f"{name}:")
    settings = python_settings(args, name, model_file, report)
    pairs = []

    def python():
        pairs.append([python_run(args, name, model_file, settings, report, seed=len(pairs))])
        return pairs[-1][0]

    def afterburner():
        seed = len(pairs) - 1  # the pair's, as its Python run's
        ours = (afterburner_python_run(args, name, model_file, report, seed) if args.afterburner_side == "python"
                else afterburner_run(args, model_file, report, steps_log, seed))
        pairs[-1].append(ours)
        theirs = pairs[-1][0]
        print(f"  pair {len(pairs)}: afterburner {ours['train_samples_per_sec']:7.0f} samples/s"
              f" (all steps {ours['all_steps_samples_per_sec']:.0f}), python {theirs['train_samples_per_sec']:7.0f}"
              f" samples/s, ratio {ours['train_samples_per_sec'] / theirs['train_samples_per_sec']:.2f}x")
        sys.stdout.flush()
        return ours

    compare_alternating(f"{name} {args.precision}", args.reps, ("python", python), ("afterburner", afterburner))
    return pairs


def accuracy_cell(reports):
    """The test accuracies of the pairs' runs of one side: median [min, max]."""
    accuracies = [r["test_accuracy"] for r in reports]
    return f"{statistics.median(accuracies):.4f} [{min(accuracies):.4f}, {max(accuracies):.4f}]"


def summary_row(name, pairs):
    python = statistics.median(p["train_samples_per_sec"] for p, _ in pairs)
    ours = statistics.median(a["train_samples_per_sec"] for _, a in pairs)
    ratio = statistics.median(a["train_samples_per_sec"] / p["train_samples_per_sec"] for p, a in pairs)
    return name, ours, python, ratio, accuracy_cell(a for _, a in pairs), accuracy_cell(p for p, _ in pairs)


def print_table(args, rows, failures):
    side = "afterburner.optimize in Python" if args.afterburner_side == "python" else "afterburner train --model"
    print(f"\n{side} against Python, {args.precision}, batch {args.batch_size}, {args.steps} timed steps "
          f"(+{WARMUP_STEPS}), medians of {args.reps} pairs (seeds 0-{args.reps - 1})")
    print(f"{'model':22s} | {'afterburner samples/s':>21s} | {'Python samples/s':>16s} | {'ratio':>6s} | "
          f"{'afterburner test acc':>24s} | {'Python test acc':>24s}")
    for name, ours, python, ratio, our_accuracy, python_accuracy in rows:
        print(f"{name:22s} | {ours:21.0f} | {python:16.0f} | {ratio:5.2f}x | {our_accuracy:>24s} | "
              f"{python_accuracy:>24s}")
    for name, error in failures.items():
        print(f"{name:22s} | failed: {error}")
    if rows:
        geometric_mean = math.exp(statistics.mean(math.log(row[3]) for row in rows))
        print(f"geometric mean of the ratios: {geometric_mean:.2f}x over {len(rows)} models")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="names from image_models.MODELS")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--steps", type=int, default=200, help="timed training steps, after 5 warm-up steps")
    parser.add_argument("--epoch", action="store_true", help="one whole epoch instead of --steps (accuracy)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--build", default="build")
    parser.add_argument("--python-channels-last", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--python-allocator", choices=("auto", *ALLOCATORS), default="auto")
    parser.add_argument("--afterburner-flags", default="", help='extra flags for afterburner train, e.g. "--channels-last"')
    parser.add_argument("--afterburner-allocator", choices=("own", "tcmalloc"), default="own",
                        help="own: the tool's linked tcmalloc, the package's glibc heap; tcmalloc: preloaded")
    parser.add_argument("--afterburner-side", choices=("cli", "python"), default="cli",
                        help="cli: `afterburner train --model FILE`; python: the Python loop with afterburner.optimize")
    args = parser.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    unknown = [m for m in args.models if m not in image_models.MODELS]
    if unknown:
        parser.error(f"unknown models {unknown} (known: {', '.join(image_models.MODELS)})")
    if args.epoch:
        args.steps = TRAIN_SAMPLES // args.batch_size - WARMUP_STEPS
    if args.steps <= 0 or args.reps <= 0:
        parser.error("--steps and --reps must be positive")
    for flag, allocator in (("--python-allocator", args.python_allocator),
                            ("--afterburner-allocator", args.afterburner_allocator)):
        if allocator == "tcmalloc" and not TCMALLOC.exists():
            parser.error(f"{flag} tcmalloc: {TCMALLOC} is missing (apt-get install libtcmalloc-minimal4)")
    return args


def main():
    args = parse_args()
    print(f"{cpu_description()}; torch {torch.__version__}, {THREADS} threads; {load_description()}")
    rows, failures = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            try:
                rows.append(summary_row(name, compare_model(args, name, tmp)))
            except SystemExit as failure:  # run_json exits on a failed run; the other models still count
                lines = [line for line in str(failure.code).splitlines() if line.strip()]
                error = lines[-1] if lines else str(failure.code)  # the error, after the command line
                print(f"  {name} failed:\n{failure.code}")
                failures[name] = error
    print_table(args, rows, failures)
    print(f"at the end: {load_description()}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--python-worker"]:
        python_worker(sys.argv[2:])
    else:
        main()
