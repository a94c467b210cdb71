#!/usr/bin/python3
"""Dropout in training: torch.ops.afterburner.dropout (what the fuse rewrite puts in the place of
aten::dropout) against torch.dropout itself, on the tensors the attention models drop out (an
nn.TransformerEncoder's attention weights [B * H, L, L] and activations [B, L, E] and [B, L, FF]),
in fp32 and bf16, in one process, alternating; median, min and max of each side over --reps
rounds of --calls calls, and the ratio. Both draw the same masks from the same seed (checked
here, bit for bit, every round).

    PYTHONPATH=build/python /usr/bin/python3 bench/dropout.py [--reps 5] [--calls 50] [--threads 2]

Run it on a quiet machine: the load average is printed at start and end.
"""
from functools import partial

import torch

import afterburner  # noqa: F401  (loads torch.ops.afterburner)
from machine import cpu_description, load_description
from op_timing import alternating_times, arguments, cells

SHAPES = {"attention weights [512, 28, 28]": (512, 28, 28), "activations [128, 28, 32]": (128, 28, 32),
          "feed-forward [128, 28, 64]": (128, 28, 64), "large [64, 1024, 256]": (64, 1024, 256)}


def same_masks(x):
    torch.manual_seed(5)
    ours = torch.ops.afterburner.dropout(x, 0.1, True)
    torch.manual_seed(5)
    return torch.equal(ours, torch.dropout(x, 0.1, True))


def main():
    args = arguments(__doc__)
    torch.set_num_threads(args.threads)
    print(f"{cpu_description()}; {args.threads} threads; {load_description()}")
    print(f"{'tensor':34} {'dtype':9} {'torch.dropout ms':>24} {'afterburner ms':>24} {'ratio':>6}")
    for name, shape in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(shape).to(dtype)

            def check():
                assert same_masks(x), "the masks differ"

            calls = {"torch": partial(torch.dropout, x, 0.1, True),
                     "ours": partial(torch.ops.afterburner.dropout, x, 0.1, True)}
            times = alternating_times(calls, check, args.reps, args.calls)
            torch_cell, our_cell, ratio = cells(times, 24)
            print(f"{name:34} {str(dtype).split('.')[1]:9} {torch_cell} {our_cell} {ratio:5.1f}x")
    print(f"at the end: {load_description()}")


if __name__ == "__main__":
    main()
