#!/usr/bin/python3
"""`afterburner sketch --tune` on the zoo's mlp, judged outside afterburner: the chosen sketched
model and the dense mlp trained with the same recipe, both run by Python PyTorch frozen for
inference (torch.jit.optimize_for_inference(torch.jit.freeze(...))), alternating: Fashion-MNIST
test accuracy, and samples/s at batch 64 and 1 (median, min and max of --reps rounds).

    PYTHONPATH=build/python /usr/bin/python3 bench/sketch_tune.py [--cli build/afterburner] [--reps 7]
"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time

import torch

from pytorch_train import DEFAULT_DATA_DIR, MEAN, STD, load_split


def test_set():
    images, labels = load_split(DEFAULT_DATA_DIR, "t10k")
    # The training set's mean and standard deviation, as afterburner train normalises.
    return ((images.float() / 255 - MEAN) / STD).unsqueeze(1), labels


def per_call_seconds(model, batch, calls):
    start = time.perf_counter()
    for _ in range(calls):
        model(batch)
    return (time.perf_counter() - start) / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cli", default="build/afterburner")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--max-accuracy-drop", default="0.01")
    args = parser.parse_args()
    torch.set_num_threads(2)
    work = tempfile.mkdtemp()
    sketched, dense = os.path.join(work, "mlp-sketched.pt"), os.path.join(work, "mlp.pt")
    tune = subprocess.run([args.cli, "sketch", "--tune", "--model", "mlp", "--max-accuracy-drop",
                           args.max_accuracy_drop, "-o", sketched], capture_output=True, text=True, check=True)
    print(tune.stdout)
    print(open(os.path.join(work, "mlp-sketched.plan.toml")).read())
    subprocess.run([args.cli, "train", "--model", "mlp", "--progress", "none", "--export", dense], check=True,
                   capture_output=True)
    images, labels = test_set()
    models = {}
    with torch.no_grad():
        for name, path in (("dense mlp", dense), ("sketched mlp", sketched)):
            model = torch.jit.load(path).eval()
            accuracy = (model(images).argmax(1) == labels).float().mean().item()
            models[name] = torch.jit.optimize_for_inference(torch.jit.freeze(model))
            print(f"{name}: test accuracy {accuracy:.4f}")
        for batch_size, calls in ((64, 200), (1, 2000)):
            batch = images[:batch_size]
            for model in models.values():
                per_call_seconds(model, batch, calls // 10)
            times = {name: [] for name in models}
            for _ in range(args.reps):
                for name, model in models.items():
                    times[name].append(batch_size / per_call_seconds(model, batch, calls))
            dense_median = statistics.median(times["dense mlp"])
            for name, values in times.items():
                median = statistics.median(values)
                print(f"batch {batch_size:3d} {name:13s} {median:10.0f} samples/s [{min(values):.0f}-{max(values):.0f}]"
                      f"  {median / dense_median:5.2f}x dense")


if __name__ == "__main__":
    main()
