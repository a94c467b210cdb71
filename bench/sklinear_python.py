#!/usr/bin/python3
"""afterburner.nn.SKLinear from Python against Panther's CPU formulation of the same layer and
against torch.nn.Linear, in one process, alternating, 2 threads.

    PYTHONPATH=build/python /usr/bin/python3 bench/sklinear_python.py [--reps 20]

Layers (batch 64, fp32): 8192 x 8192 with L = 1, k = 16, and 4096 x 4096 with L = 2, k = 64.
Panther's formulation is written here from its definition (panther.nn.SKLinear on CPU without
its compiled extension): the input broadcast over the L terms, then bmm by S1s and U1s and by
U2s and S2s, summed over the terms and scaled by 1/(2L). All three get the same S1s, S2s, U1s,
U2s and bias. Forward runs under no_grad; forward+backward computes the gradients of the input
and every trainable parameter for a fixed upstream gradient. Each figure is the median of
--reps alternating repetitions (min and max alongside), after 3 warm-up calls each.
afterburner.heap.keep_freed_memory() is on for all three unless --no-keep-freed-memory: without
it each call's 4-8 MB temporaries are fresh, page-faulted mappings (as in the C++ tool, which
keeps freed memory too).
"""

import argparse
import statistics
import time

import torch

import afterburner.heap
from afterburner import nn as abnn


def panther_forward(x, S1s, S2s, U1s, U2s, bias):
    terms = S1s.shape[0]
    stacked = x.unsqueeze(0).expand(terms, *x.shape)
    y = (stacked.bmm(S1s).bmm(U1s) + stacked.bmm(U2s).bmm(S2s)).sum(0) / (2 * terms)
    return y + bias


def timed(fn, backward):
    start = time.perf_counter()
    if backward:
        fn()
    else:
        with torch.no_grad():
            fn()
    return (time.perf_counter() - start) * 1e3


def contestants(in_features, out_features, terms, rank, batch):
    torch.manual_seed(0)
    sketched = abnn.SKLinear(in_features, out_features, num_terms=terms, low_rank=rank)
    dense = torch.nn.Linear(in_features, out_features)
    x = torch.randn(batch, in_features, requires_grad=True)
    grad = torch.randn(batch, out_features)
    tensors = (sketched.S1s, sketched.S2s, sketched.U1s, sketched.U2s, sketched.bias)

    def run(forward, params, backward):
        def call():
            y = forward()
            if backward:
                torch.autograd.grad(y, [x, *params], grad)
        return call

    return {
        "torch.nn.Linear": lambda b: run(lambda: dense(x), list(dense.parameters()), b),
        "Panther's formulation": lambda b: run(lambda: panther_forward(x, *tensors), list(sketched.parameters()), b),
        "afterburner SKLinear": lambda b: run(lambda: sketched(x), list(sketched.parameters()), b),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--keep-freed-memory", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.keep_freed_memory:
        afterburner.heap.keep_freed_memory()
    for in_features, out_features, terms, rank in ((8192, 8192, 1, 16), (4096, 4096, 2, 64)):
        flop_ratio = in_features * out_features / (2 * terms * rank * (in_features + out_features))
        print(f"{in_features} x {out_features}, L = {terms}, k = {rank}, batch {args.batch}: "
              f"FLOP ratio {flop_ratio:.0f}x")
        layers = contestants(in_features, out_features, terms, rank, args.batch)
        for backward in (False, True):
            calls = {name: make(backward) for name, make in layers.items()}
            times = {name: [] for name in calls}
            for call in calls.values():
                for _ in range(3):
                    call()
            for _ in range(args.reps):
                for name, call in calls.items():
                    times[name].append(timed(call, backward))
            dense = statistics.median(times["torch.nn.Linear"])
            print(f"  {'forward+backward' if backward else 'forward'}:")
            for name, values in times.items():
                median = statistics.median(values)
                print(f"    {name:22s} {median:8.3f} ms [{min(values):.3f}-{max(values):.3f}]"
                      f"   torch.nn.Linear's time over this: {dense / median:6.1f}x"
                      f" ({dense / median / flop_ratio:.2f} of the FLOP ratio)")


if __name__ == "__main__":
    main()
