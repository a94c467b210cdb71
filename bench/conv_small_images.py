#!/usr/bin/python3
"""Convolutions of small images in bf16 training: torch.ops.afterburner.conv2d (what the fuse
rewrite puts in the place of aten::conv2d: a GEMM weight gradient of ours at up to 4 output pixels
per image, a linear layer on the tap that reads a 1-pixel image) against torch.conv2d, each a
forward under bf16 autocast and a backward to the fp32 input and weight, on ResNet-18's layers
with 28-pixel inputs (its third and fourth stages see 2x2 and 1x1 images) and on two shapes
above the 4-pixel limit, which run LibTorch's backward on both sides (their ratio shows the noise).
In one process, alternating; median, min and max of each side over --reps rounds of --calls
calls, and the ratio. The weight gradients are checked against each other every round (within
bf16's rounding of the largest).

    PYTHONPATH=build/python /usr/bin/python3 bench/conv_small_images.py [--reps 5] [--calls 50] [--threads 2]

Run it on a quiet machine: the load average is printed at start and end.
"""
from functools import partial

import torch

import afterburner  # noqa: F401  (loads torch.ops.afterburner)
from machine import cpu_description, load_description
from op_timing import alternating_times, arguments, cells

# name: (batch, in channels, out channels, image size, filter size, stride)
SHAPES = {"layer3 3x3 256 on 2x2": (128, 256, 256, 2, 3, 1), "layer3 3x3 128->256 4x4 s2": (128, 128, 256, 4, 3, 2),
          "layer4 3x3 256->512 2x2 s2": (128, 256, 512, 2, 3, 2), "layer4 3x3 512 on 1x1": (128, 512, 512, 1, 3, 1),
          "3x3 512 on 2x2": (128, 512, 512, 2, 3, 1), "3x3 128 on 4x4 (LibTorch's)": (128, 128, 128, 4, 3, 1),
          "3x3 64 on 7x7 (LibTorch's)": (128, 64, 64, 7, 3, 1)}


def forward_backward(conv, x, w, dy):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conv(x, w)
    return torch.autograd.grad(y, (x, w), dy)[1]


def main():
    args = arguments(__doc__)
    torch.set_num_threads(args.threads)
    print(f"{cpu_description()}; {args.threads} threads; {load_description()}")
    print(f"{'layer (batch 128, channels_last)':32} {'torch forward+backward ms':>26}"
          f" {'afterburner ms':>24} {'ratio':>6}")
    for name, (batch, channels, outputs, size, kernel, stride) in SHAPES.items():
        channels_last = torch.channels_last
        x = torch.randn(batch, channels, size, size).contiguous(memory_format=channels_last).requires_grad_()
        w = torch.randn(outputs, channels, kernel, kernel).contiguous(memory_format=channels_last).requires_grad_()
        padding = kernel // 2
        sides = {"torch": lambda x, w: torch.conv2d(x, w, None, stride, padding),
                 "ours": lambda x, w: torch.ops.afterburner.conv2d(x, w, None, [stride] * 2, [padding] * 2, [1, 1], 1)}
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out_size = sides["torch"](x, w).shape[2:]
        dy = torch.randn(batch, outputs, *out_size, dtype=torch.bfloat16).contiguous(memory_format=channels_last)

        def check():
            ours, theirs = forward_backward(sides["ours"], x, w, dy), forward_backward(sides["torch"], x, w, dy)
            assert ((ours - theirs).abs() <= theirs.abs().max() / 128).all(), name

        calls = {side: partial(forward_backward, conv, x, w, dy) for side, conv in sides.items()}
        times = alternating_times(calls, check, args.reps, args.calls)
        torch_cell, our_cell, ratio = cells(times, 24)
        print(f"{name:32} {torch_cell:>26} {our_cell} {ratio:5.2f}x")
    print(f"at the end: {load_description()}")


if __name__ == "__main__":
    main()
