#!/usr/bin/python3
"""`afterburner sketch --tune` judged outside afterburner: the chosen sketched model and the dense
model trained with the same recipe, both run by Python PyTorch, alternating: Fashion-MNIST test
accuracy, and samples/s at batch 64 and 1 (median, min and max of --reps rounds). Each model runs
in the best of PyTorch's three ways for inference at each batch size (as loaded, torch.jit.freeze,
freeze + optimize_for_inference: which is best differs by model and batch), chosen by a first
measurement and printed. Every timing runs in a process of its own (the two models alternate
between processes): timed in one process, a dense model ran at half its speed after the sketched
one had run.

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
import sys
import tempfile
import time

import torch
from torch import nn

import afterburner  # noqa: F401  (a sketched file's attention calls afterburner's ops)
from pytorch_train import DEFAULT_DATA_DIR, MEAN, STD, load_split


class Patches(nn.Module):
    """Fashion-MNIST as 196 tokens of 2x2 pixels through one encoder layer."""

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
    parser.add_argument("--time", help=argparse.SUPPRESS)  # internal: time one model in this process
    parser.add_argument("--way", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.time:
        return time_one(args)
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
    with torch.no_grad():
        for name, path in (("dense", dense), ("sketched", sketched)):
            accuracy = (torch.jit.load(path).eval()(images).argmax(1) == labels).float().mean().item()
            print(f"{name}: test accuracy {accuracy:.4f}")
    files = {"dense": dense, "sketched": sketched}
    for batch_size, calls in ((64, 200), (1, 2000)):
        ways = {}
        for name, path in files.items():
            speed = {way: samples_per_second_in_a_process(path, way, batch_size, calls // 4) for way in WAYS}
            ways[name] = max(speed, key=speed.get)
            print(f"batch {batch_size:3d} {name:9s} runs {ways[name]} (" +
                  ", ".join(f"{way} {rate:.0f}" for way, rate in speed.items()) + " samples/s)", flush=True)
        rates = {name: [] for name in files}
        for _ in range(args.reps):
            for name, path in files.items():
                rates[name].append(samples_per_second_in_a_process(path, ways[name], batch_size, calls))
        dense_median = statistics.median(rates["dense"])
        for name, values in rates.items():
            median = statistics.median(values)
            print(f"batch {batch_size:3d} {name:9s} {median:10.0f} samples/s [{min(values):.0f}-{max(values):.0f}]"
                  f"  {median / dense_median:5.2f}x dense", flush=True)


WAYS = ("as loaded", "frozen", "frozen + optimize_for_inference")


def load_for_inference(path, way):
    model = torch.jit.load(path).eval()
    if way == "as loaded":
        return model
    frozen = torch.jit.freeze(model)
    return frozen if way == "frozen" else torch.jit.optimize_for_inference(frozen)


def samples_per_second_in_a_process(path, way, batch_size, calls):
    """This script run again as `--time`: a fresh process, 2 threads, calls // 10 warm-up calls."""
    done = subprocess.run([sys.executable, __file__, "--time", path, "--way", way, "--batch", str(batch_size),
                           "--calls", str(calls)], capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def time_one(args):
    torch.set_num_threads(2)
    model = load_for_inference(args.time, args.way)
    batch = test_set()[0][:args.batch]
    with torch.no_grad():
        per_call_seconds(model, batch, args.calls // 10)
        print(args.batch / per_call_seconds(model, batch, args.calls))


if __name__ == "__main__":
    main()
