#!/usr/bin/python3
"""A sketched layer followed by ReLU and Dropout: afterburner.nn.SKLinear(relu=True, dropout=p)
(one autograd node, one pass over the output each way) against the same SKLinear followed by
torch.nn.ReLU and torch.nn.Dropout (three nodes, as Panther's users write it), and against those
three nodes with afterburner's own dropout (its noise drawn in bulk, as afterburner.jit.fuse and
afterburner.optimize put it), in one process, alternating, 2 threads.

    PYTHONPATH=build/python /usr/bin/python3 bench/sklinear_epilogue.py [--reps 20] [--calls 20]

Rows: one layer's training call (forward and the gradients of its input and parameters) at the
sizes of the sketched-layer benchmarks, and one training step (forward, backward, SGD) of a
sketched MLP (784 -> 1024 -> 1024 -> 10, both hidden layers SKLinear L 1 k 64 + ReLU + Dropout
0.1, batch 128), which is `afterburner.nn.fuse` applied to the unfused model. Both sides run the
same tensors from the same seed and give the same values (checked first). Each figure is the
median over --reps alternating repetitions of --calls calls (min and max alongside), after
warm-up, beside what one forward keeps for backward (autograd's saved tensors, each storage
counted once); afterburner.heap.keep_freed_memory() is on for all three.
"""

import argparse
import copy
import statistics
import time

import torch

import afterburner.heap
from afterburner import nn as abnn


class BulkDropout(torch.nn.Dropout):
    """torch.nn.Dropout on afterburner's dropout op: the same bits, the noise drawn in bulk."""

    def forward(self, x):
        return torch.ops.afterburner.dropout(x, self.p, self.training)


def three_ways(layers, p):
    """(as written, with afterburner's dropout, fused) over the same tensors."""
    plain = torch.nn.Sequential(*layers)
    bulk = copy.deepcopy(plain)
    for i, layer in enumerate(bulk):
        if type(layer) is torch.nn.Dropout:
            bulk[i] = BulkDropout(p)
    fused = copy.deepcopy(plain)
    abnn.fuse(fused)
    return plain, bulk, fused


def layer_calls(in_features, out_features, terms, rank, batch, p):
    torch.manual_seed(0)
    models = three_ways([abnn.SKLinear(in_features, out_features, terms, rank), torch.nn.ReLU(), torch.nn.Dropout(p)], p)
    x = torch.randn(batch, in_features, requires_grad=True)
    grad = torch.randn(batch, out_features)

    def call(model):
        def run():
            torch.autograd.grad(model(x), [x, *model.parameters()], grad)
        return run
    return [call(model) for model in models], models, x


def mlp_steps(batch, p):
    torch.manual_seed(0)
    models = three_ways([torch.nn.Flatten(), abnn.SKLinear(784, 1024, 1, 64), torch.nn.ReLU(), torch.nn.Dropout(p),
                         abnn.SKLinear(1024, 1024, 1, 64), torch.nn.ReLU(), torch.nn.Dropout(p),
                         torch.nn.Linear(1024, 10)], p)
    x, target = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

    def step(model):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def run():
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), target).backward()
            optimizer.step()
        return run
    return [step(model) for model in models], models, x


def saved_mib(model, x):
    """What the forward keeps for backward (autograd's saved tensors, each storage once), in MiB."""
    storages = {}

    def pack(t):
        storages[t.storage().data_ptr()] = t.storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(storages.values()) / 2**20


def check_same_values(models, x):
    outputs = []
    for model in models:
        torch.manual_seed(1)
        outputs.append(model(x))
    assert all(torch.equal(outputs[0], y) for y in outputs[1:]), "the three ways differ"


def measure(name, runs, kept, reps, calls):
    for run in runs:
        for _ in range(3):
            run()
    times = [[] for _ in runs]
    for _ in range(reps):
        for run, series in zip(runs, times):
            start = time.perf_counter()
            for _ in range(calls):
                run()
            series.append((time.perf_counter() - start) * 1e3 / calls)
    med = [statistics.median(series) for series in times]
    cells = [f"{m:.3f} ({min(series):.3f}-{max(series):.3f}), {mib:.1f} MiB" for m, series, mib in zip(med, times, kept)]
    ratios = [sorted(a / b for a, b in zip(series, times[2])) for series in times[:2]]
    print(f"| {name} | " + " | ".join(cells) + " | " +
          " | ".join(f"**{m / med[2]:.2f}x** ({r[0]:.2f}-{r[-1]:.2f})" for m, r in zip(med[:2], ratios)) + " |",
          flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--dropout", type=float, default=0.1)
    args = parser.parse_args()
    torch.set_num_threads(2)
    afterburner.heap.keep_freed_memory()
    print("| call: ms, kept for backward | SKLinear + nn.ReLU + nn.Dropout | the same, afterburner's dropout | "
          "SKLinear(relu=True, dropout=p) | first over fused | second over fused |")
    print("| --- | --- | --- | --- | --- | --- |")
    rows = [("layer 1024 x 1024, L 1, k 64, batch 128", layer_calls(1024, 1024, 1, 64, 128, args.dropout)),
            ("layer 4096 x 4096, L 2, k 64, batch 64", layer_calls(4096, 4096, 2, 64, 64, args.dropout)),
            ("layer 8192 x 8192, L 1, k 16, batch 64", layer_calls(8192, 8192, 1, 16, 64, args.dropout)),
            ("layer 1024 x 1024, L 1, k 64, batch 2048", layer_calls(1024, 1024, 1, 64, 2048, args.dropout)),
            ("sketched MLP training step, batch 128", mlp_steps(128, args.dropout))]
    for name, (runs, models, x) in rows:
        check_same_values(models, x)
        x_for_saving = x.detach().requires_grad_()  # the input's gradient wanted, as in the layer rows
        measure(name, runs, [saved_mib(model, x_for_saving) for model in models], args.reps, args.calls)


if __name__ == "__main__":
    main()
