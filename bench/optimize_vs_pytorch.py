#!/usr/bin/python3
"""`afterburner optimize` against Python PyTorch's own inference paths on the same model file.

    /usr/bin/python3 bench/optimize_vs_pytorch.py MODEL.pt --arch cnn [--build build]
        [--precisions fp32,bf16,int8] [--reps 5] [--threads 2] [--seconds 0.3]

MODEL.pt is a TorchScript file of the zoo model --arch (e.g. `afterburner train --model cnn
--export cnn.pt`, or bench/export_reference.py). For each precision the script runs
`afterburner optimize MODEL.pt -o <tmp>/<precision>.pt --precision P --force` once, then in this one
Python process times, at batch 1 and 64, rep after rep in turn (so all see the same machine):
  eager          the same weights in bench/pytorch_train.py's nn.Sequential
  frozen+ofi     torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.load(MODEL.pt)))
  afterburner-P  the optimized file, loaded and laid out for oneDNN the way afterburner's
                 infer::load_optimized does (torch.jit.load + optimize_for_inference)
Speed is samples/s over calls of one input for `--seconds`; printed as the median over reps with
min and max, and each variant's median ratio to frozen+ofi. Then top-1 agreement with the fp32
model (MODEL.pt as loaded) and accuracy, on the full Fashion-MNIST test set (10,000 images).
glibc hands large freed blocks back to the OS, so each call's activations are page-faulted anew;
afterburner keeps them (afterburner::keep_freed_memory) and its bf16 cnn runs about 3x faster for
it. Run this script under
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=1073741824
to give the Python process (every variant, the PyTorch baselines included) the same heap.
The numbers afterburner's own C++ process printed (`after (P...)` at batch 1 and 64) are listed
too, for comparison with the Python-timed ones.
"""

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pytorch_train import DEFAULT_DATA_DIR, MODEL_NAMES, build_model, load_split, positive_int  # noqa: E402

BATCH_SIZES = (1, 64)
MEAN, STD = 0.2860, 0.3530


def eager_twin(scripted, arch):
    """The nn.Sequential twin of a zoo export: afterburner names layer i "layer<i>", Python "<i>"."""
    model = build_model(arch)
    state = {re.sub(r"^layer", "", name): value for name, value in scripted.state_dict().items()}
    model.load_state_dict(state)
    return model.eval()


def run_optimize(binary, model, out, precision, threads):
    command = [str(binary), "optimize", str(model), "-o", str(out), "--precision", precision, "--force",
               "--threads", str(threads)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(command)}\n{result.stderr}")
    after = result.stdout[result.stdout.index("after ("):]
    return {int(b): float(s) for b, s in re.findall(r"batch (\d+): (\d+) samples/s", after)}


def samples_per_second(model, batch, seconds):
    x = torch.randn(batch, 1, 28, 28)
    for _ in range(3):
        model(x)
    calls, start = 0, time.perf_counter()
    while calls < 5 or time.perf_counter() - start < seconds:
        model(x)
        calls += 1
    return batch * calls / (time.perf_counter() - start)


def predictions(model, images):
    return torch.cat([model(chunk).float().argmax(1) for chunk in images.split(500)])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--arch", choices=MODEL_NAMES, required=True)
    parser.add_argument("--build", type=Path, default=Path("build"))
    parser.add_argument("--precisions", default="fp32,bf16,int8")
    parser.add_argument("--reps", type=positive_int, default=5)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--seconds", type=float, default=0.3)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    original = torch.jit.load(str(args.model)).eval()
    variants = {"eager": eager_twin(original, args.arch),
                "frozen+ofi": torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.load(str(args.model)).eval()))}
    cpp_speed = {}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in args.precisions.split(","):
            out = Path(tmp) / f"{precision}.pt"
            cpp_speed[precision] = run_optimize(args.build / "afterburner", args.model, out, precision, args.threads)
            variants[f"afterburner-{precision}"] = torch.jit.optimize_for_inference(torch.jit.load(str(out)))

    speeds = {(name, batch): [] for name in variants for batch in BATCH_SIZES}
    with torch.inference_mode():
        for rep in range(args.reps):
            for name, model in variants.items():
                for batch in BATCH_SIZES:
                    speeds[(name, batch)].append(samples_per_second(model, batch, args.seconds))
            print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)

        print(f"{args.model} ({args.arch}), {args.threads} threads, {args.reps} reps, torch {torch.__version__}")
        print("samples/s: median [min, max], ratio of medians to frozen+ofi")
        for batch in BATCH_SIZES:
            base = statistics.median(speeds[("frozen+ofi", batch)])
            for name in variants:
                values = speeds[(name, batch)]
                median = statistics.median(values)
                print(f"  batch {batch:>3} {name:<18} {median:>9.0f} [{min(values):.0f}, {max(values):.0f}]"
                      f"  x{median / base:.2f}")
        for precision, speed in cpp_speed.items():
            listed = ", ".join(f"batch {b}: {speed[b]:.0f}" for b in BATCH_SIZES if b in speed)
            print(f"  afterburner's C++ process, {precision}: {listed} samples/s")

        images, labels = load_split(args.data, "t10k")
        images = (images.float().unsqueeze(1) / 255 - MEAN) / STD
        reference = predictions(original, images)
        print(f"Fashion-MNIST test set ({len(labels)} images): fp32 accuracy "
              f"{reference.eq(labels).float().mean():.4f}")
        for name, model in variants.items():
            predicted = predictions(model, images)
            print(f"  {name:<18} top-1 agreement with fp32 {predicted.eq(reference).float().mean():.4f}, "
                  f"accuracy {predicted.eq(labels).float().mean():.4f}")


if __name__ == "__main__":
    main()
