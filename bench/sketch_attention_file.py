"""A transformer file as users write it, before and after `afterburner sketch --attention-features M`.

The model: nn.TransformerEncoder (batch first, --layers layers of embed --embed, --heads heads,
feed-forward 2 x embed, no dropout) and a Linear head on the mean, scripted by Python. The CLI
replaces its attention by random-feature attention with the same weights; both files are loaded by
Python (torch.jit.load; `import afterburner` for the sketched one) and timed on the same input, in
inference (torch.no_grad: the dense file's TransformerEncoder takes PyTorch's fused fast path, its
best) and for one training step's forward and backward. After --warmup untimed calls each, the two
alternate within each repetition; each figure is the median [min, max] over repetitions of the
median of --iters calls, with the ratio dense / sketched. Also printed: how far the sketched
model's outputs are from the dense model's (random features approximate attention: the error
falls as 1/sqrt(M)).

  /usr/bin/python3 bench/sketch_attention_file.py [--lengths 256,1024,4096] [--embed 256] [--heads 4]
      [--layers 2] [--features 128] [--batch 1] [--reps 3] [--iters 5] [--warmup 5] [--threads 2]
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "build", "python"))
import afterburner  # noqa: E402,F401  (the sketched file calls afterburner's ops)

BINARY = os.environ.get("AFTERBURNER_BINARY", os.path.join(HERE, "..", "build", "afterburner"))


class Classifier(nn.Module):
    def __init__(self, embed, heads, layers):
        super().__init__()
        layer = nn.TransformerEncoderLayer(embed, heads, 2 * embed, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(embed, 10)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


def files(args, directory):
    torch.manual_seed(0)
    dense = os.path.join(directory, "dense.pt")
    sketched = os.path.join(directory, "sketched.pt")
    torch.jit.script(Classifier(args.embed, args.heads, args.layers).eval()).save(dense)
    subprocess.run([BINARY, "sketch", dense, "-o", sketched, "--attention-features", str(args.features)], check=True,
                   stdout=subprocess.DEVNULL)
    return torch.jit.load(dense), torch.jit.load(sketched)


def median_seconds(call, iters):
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def inference(model, x):
    def call():
        with torch.no_grad():
            model(x)
    return call


def training_step(model, x):
    def call():
        model.zero_grad(set_to_none=True)
        model(x).square().sum().backward()
    return call


def summary(values):
    return f"{statistics.median(values) * 1e3:9.1f} ms [{min(values) * 1e3:.1f}, {max(values) * 1e3:.1f}]"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="256,1024,4096")
    parser.add_argument("--embed", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls of each file before each mode's timing")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as directory:
        dense, sketched = files(args, directory)
        print(f"TransformerEncoder: {args.layers} layers, embed {args.embed}, {args.heads} heads, batch {args.batch}; "
              f"sketched with {args.features} random features per head; {args.threads} threads")
        print(f"{'length':>6} {'mode':>9}   {'dense file (PyTorch)':>30}   {'sketched file':>30}   ratio  "
              f"output error")
        for length in (int(n) for n in args.lengths.split(",")):
            x = torch.randn(args.batch, length, args.embed)
            with torch.no_grad():
                reference = dense(x)
                error = ((sketched(x) - reference).abs().max() / reference.abs().max()).item()
            for mode, make in (("inference", inference), ("training", training_step)):
                for model in (dense, sketched):  # TorchScript's profiling executor settles in a few calls
                    for _ in range(args.warmup):
                        make(model, x)()
                times = {"dense": [], "sketched": []}
                for _ in range(args.reps):
                    for name, model in (("dense", dense), ("sketched", sketched)):
                        times[name].append(median_seconds(make(model, x), args.iters))
                ratio = statistics.median(times["dense"]) / statistics.median(times["sketched"])
                print(f"{length:>6} {mode:>9}   {summary(times['dense']):>30}   {summary(times['sketched']):>30}   "
                      f"{ratio:5.2f}x  {error:.3f}", flush=True)


if __name__ == "__main__":
    main()
