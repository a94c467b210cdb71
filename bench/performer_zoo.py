#!/usr/bin/python3
"""The zoo's performer (`afterburner train --model performer`: each pixel row a token, embed 64,
2 pre-norm blocks of 4 heads, m = 32 random features per head) against the same network written
in Python and trained in a plain PyTorch loop, once with afterburner.nn.RandMultiHeadAttention
and once with torch.nn.MultiheadAttention (exact attention), one epoch of Fashion-MNIST each, in
alternation within each of --reps repetitions.

    PYTHONPATH=build/python /usr/bin/python3 bench/performer_zoo.py [--reps 3] [--precision bf16]

Recipe on both sides, afterburner train's defaults: SGD (momentum 0.9, Nesterov, weight decay
5e-4), lr 0.1 cosine to 0 after 100 warm-up steps, batch 128, one epoch of the 60,000 images
normalised once and kept in memory (the Python side's best loader on 2 cores: no workers), 2
threads, bf16 autocast unless --precision fp32 (check /proc/cpuinfo for avx512_bf16; Python
evaluates in fp32, untimed). Printed per
run: seconds of training, samples/s, test accuracy; then medians [min-max] and afterburner's time
over each Python side's.
"""
import argparse
import math
import re
import statistics
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from afterburner import nn as abnn
from pytorch_train import DEFAULT_DATA_DIR, MEAN, STD, load_split, schedule_factor

BINARY = Path(__file__).resolve().parents[1] / "build" / "afterburner"


class Block(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.ln1, self.attention, self.ln2 = nn.LayerNorm(64), attention, nn.LayerNorm(64)
        self.fc1, self.fc2 = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x):
        normed = self.ln1(x)
        h = x + self.attention(normed, normed, normed)[0]
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))


class Performer(nn.Module):
    """models::make_model("performer") written in Python."""

    def __init__(self, exact):
        super().__init__()
        self.embed, self.position = nn.Linear(28, 64), nn.Parameter(torch.randn(28, 64) * 0.02)
        make = (lambda: nn.MultiheadAttention(64, 4, batch_first=True)) if exact else \
            (lambda: abnn.RandMultiHeadAttention(64, 4, 32))
        self.blocks = nn.Sequential(Block(make()), Block(make()))
        self.norm, self.head = nn.LayerNorm(64), nn.Linear(64, 10)

    def forward(self, images):
        x = self.embed(images.flatten(1, 2)) + self.position  # [B, 1, 28, 28]: rows as tokens
        return self.head(self.norm(self.blocks(x)).mean(1))


def python_run(exact, train, test, precision, seed):
    torch.manual_seed(seed)
    model = Performer(exact)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    steps = math.ceil(len(train[0]) / 128)
    autocast = dict(device_type="cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    start = time.perf_counter()
    model.train()
    for step, batch in enumerate(torch.randperm(len(train[0])).split(128)):
        for group in optimizer.param_groups:
            group["lr"] = 0.1 * schedule_factor("cosine", step, steps, 100)
        with torch.autocast(**autocast):
            loss = F.cross_entropy(model(train[0][batch]), train[1][batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():  # fp32: nn.MultiheadAttention's evaluation fast path refuses autocast's bf16
        correct = sum((model(x).argmax(1) == y).sum().item() for x, y in zip(test[0].split(128), test[1].split(128)))
    return seconds, correct / len(test[0])


def afterburner_run(precision, seed):
    out = subprocess.run([str(BINARY), "train", "--model", "performer", "--epochs", "1", "--seed", str(seed),
                          "--precision", precision, "--progress", "none"], check=True, capture_output=True,
                         text=True).stdout
    accuracy = float(re.search(r"test accuracy\s+([0-9.]+)", out).group(1))
    seconds = float(re.search(r"over \d+ steps \(([0-9.]+) s of training\)", out).group(1))
    return seconds, accuracy


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    args = parser.parse_args()
    torch.set_num_threads(2)
    train, test = [], []
    for name, split in (("train", train), ("t10k", test)):
        images, labels = load_split(DEFAULT_DATA_DIR, name)
        split.extend([((images.float() / 255 - MEAN) / STD).view(-1, 1, 28, 28).contiguous(), labels])
    runs = {"afterburner train --model performer": [], "Python, RandMultiHeadAttention": [],
            "Python, nn.MultiheadAttention": []}
    for rep in range(args.reps):
        for name in runs:
            if name.startswith("afterburner"):
                result = afterburner_run(args.precision, rep)
            else:
                result = python_run("nn.Multi" in name, train, test, args.precision, rep)
            runs[name].append(result)
            print(f"  repetition {rep + 1}: {name}: {result[0]:.1f} s, {len(train[0]) / result[0]:.0f} samples/s, "
                  f"test accuracy {result[1]:.4f}", flush=True)
    print(f"\n| one epoch, {args.precision} | training s | samples/s | test accuracy | afterburner's time over it |")
    print("| --- | --- | --- | --- | --- |")
    ours = statistics.median(s for s, _ in runs["afterburner train --model performer"])
    for name, results in runs.items():
        seconds, accuracies = [s for s, _ in results], [a for _, a in results]
        median = statistics.median(seconds)
        print(f"| {name} | {median:.1f} [{min(seconds):.1f}-{max(seconds):.1f}] | {len(train[0]) / median:.0f} | "
              f"{statistics.median(accuracies):.4f} [{min(accuracies):.4f}-{max(accuracies):.4f}] | "
              f"{ours / median:.2f}x |")


if __name__ == "__main__":
    main()
