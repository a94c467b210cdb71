#!/usr/bin/python3
"""GELU's gradient in training: torch.ops.afterburner.gelu (what the fuse rewrite puts in the place
of aten::gelu: LibTorch's forward, afterburner's gradient) against torch's GELU, each a forward
and a backward (torch.autograd.grad), on the tensors the models compute GELU on (the ViT's and
the attention models' MLP activations [B, L, 64], a ConvNeXt stage's [B, 7, 7, 4C] and
[B, 14, 14, 4C]), in fp32 and bf16, in one process, alternating; median, min and max of each
side over --reps rounds of --calls calls, and the ratio. The gradients are checked against each
other every round (bf16: within one rounding).

    PYTHONPATH=build/python /usr/bin/python3 bench/gelu.py [--reps 5] [--calls 50] [--threads 2]

Run it on a quiet machine: the load average is printed at start and end.
"""
from functools import partial

import torch
import torch.nn.functional as F

import afterburner  # noqa: F401  (loads torch.ops.afterburner)
from machine import cpu_description, load_description
from op_timing import alternating_times, arguments, cells

SHAPES = {"MLP [128, 17, 64]": (128, 17, 64), "MLP [128, 28, 64]": (128, 28, 64),
          "ConvNeXt [128, 7, 7, 256]": (128, 7, 7, 256), "ConvNeXt [64, 14, 14, 384]": (64, 14, 14, 384)}


def forward_backward(gelu, x, dy):
    return torch.autograd.grad(gelu(x), x, dy)[0]


def main():
    args = arguments(__doc__)
    torch.set_num_threads(args.threads)
    print(f"{cpu_description()}; {args.threads} threads; {load_description()}")
    print(f"{'tensor':28} {'dtype':9} {'torch forward+backward ms':>26} {'afterburner ms':>24} {'ratio':>6}")
    sides = {"torch": F.gelu, "ours": torch.ops.afterburner.gelu}
    for name, shape in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(shape).to(dtype).requires_grad_()
            dy = torch.randn(shape).to(dtype)

            def check():
                ours, theirs = forward_backward(sides["ours"], x, dy), forward_backward(sides["torch"], x, dy)
                bound = 1e-5 if dtype == torch.float32 else 1 / 128
                assert ((ours.double() - theirs.double()).abs() <= bound * theirs.double().abs().clamp_min(1)).all()

            calls = {side: partial(forward_backward, gelu, x, dy) for side, gelu in sides.items()}
            times = alternating_times(calls, check, args.reps, args.calls)
            torch_cell, our_cell, ratio = cells(times, 24)
            print(f"{name:28} {str(dtype).split('.')[1]:9} {torch_cell:>26} {our_cell} {ratio:5.2f}x")
    print(f"at the end: {load_description()}")


if __name__ == "__main__":
    main()
