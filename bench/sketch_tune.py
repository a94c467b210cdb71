#!/usr/bin/python3
"""`afterburner sketch --tune` judged outside afterburner: the chosen sketched model and the dense
model trained with the same recipe, both run by Python PyTorch, alternating: Fashion-MNIST test
accuracy, and samples/s at batch 64 and 1 (median, min and max of --reps rounds). Each model runs
in the best of PyTorch's three ways for inference at each batch size (as loaded, torch.jit.freeze,
freeze + optimize_for_inference: which is best differs by model and batch), chosen by a first
measurement and printed.

--model is a zoo model (default mlp) or `patches`: a TorchScript file this script writes, Fashion-MNIST
as 196 tokens of 2x2 pixels through one nn.TransformerEncoder layer (embed 32, 2 heads), whose
attention the search may replace by random features. --recipe adds training options to both runs.

    PYTHONPATH=build/python /usr/bin/python3 bench/sketch_tune.py [--model mlp|patches] [--recipe "--epochs 1"]
        [--cli build/afterburner] [--reps 7] [--max-accuracy-drop 0.01]
"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time

import torch
from torch import nn

import afterburner  # noqa: F401  (a sketched file's attention calls afterburner's ops)
from pytorch_train import DEFAULT_DATA_DIR, MEAN, STD, load_split


class Patches(nn.Module):
    """Fashion-MNIST as 196 tokens of 2x2 pixels through one encoder layer (also tests/python's)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 32)
        self.position = nn.Parameter(torch.randn(1, 196, 32) * 0.02)
        layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        b = x.size(0)
        tokens = x.reshape(b, 14, 2, 14, 2).permute(0, 1, 3, 2, 4).reshape(b, 196, 4)
        return self.head(self.encoder(self.embed(tokens) + self.position).mean(1))


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
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--recipe", default="", help="training options for both runs, e.g. '--epochs 1'")
    args = parser.parse_args()
    torch.set_num_threads(2)
    work = tempfile.mkdtemp()
    model = args.model
    if model == "patches":
        torch.manual_seed(0)
        model = os.path.join(work, "patches.pt")
        torch.jit.script(Patches()).save(model)
    recipe = args.recipe.split()
    sketched, dense = os.path.join(work, "sketched.pt"), os.path.join(work, "dense.pt")
    tune = subprocess.run([args.cli, "sketch", "--tune", "--model", model, "--max-accuracy-drop", args.max_accuracy_drop,
                           *recipe, "-o", sketched], capture_output=True, text=True)
    print(tune.stdout, tune.stderr)
    tune.check_returncode()
    print(open(os.path.join(work, "sketched.plan.toml")).read())
    subprocess.run([args.cli, "train", "--model", model, "--progress", "none", *recipe, "--export", dense], check=True,
                   capture_output=True)
    images, labels = test_set()
    ways = {}
    with torch.no_grad():
        for name, path in (("dense", dense), ("sketched", sketched)):
            loaded = torch.jit.load(path).eval()
            accuracy = (loaded(images).argmax(1) == labels).float().mean().item()
            print(f"{name}: test accuracy {accuracy:.4f}")
            ways[name] = {"as loaded": loaded, "frozen": torch.jit.freeze(torch.jit.load(path).eval()),
                          "frozen + optimize_for_inference":
                              torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.load(path).eval()))}
        for batch_size, calls in ((64, 200), (1, 2000)):
            batch = images[:batch_size]
            models = {}
            for name, candidates in ways.items():
                speed = {}
                for way, model in candidates.items():
                    per_call_seconds(model, batch, calls // 10)
                    speed[way] = min(per_call_seconds(model, batch, calls // 4) for _ in range(3))
                best = min(speed, key=speed.get)
                print(f"batch {batch_size:3d} {name:9s} runs {best} (" +
                      ", ".join(f"{way} {batch_size / t:.0f}" for way, t in speed.items()) + " samples/s)")
                models[name] = candidates[best]
            times = {name: [] for name in models}
            for _ in range(args.reps):
                for name, model in models.items():
                    times[name].append(batch_size / per_call_seconds(model, batch, calls))
            dense_median = statistics.median(times["dense"])
            for name, values in times.items():
                median = statistics.median(values)
                print(f"batch {batch_size:3d} {name:9s} {median:10.0f} samples/s [{min(values):.0f}-{max(values):.0f}]"
                      f"  {median / dense_median:5.2f}x dense")


if __name__ == "__main__":
    main()
