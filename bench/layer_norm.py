#!/usr/bin/python3
"""LayerNorm in training: torch.ops.afterburner.layer_norm (what the fuse rewrite puts in the place
of aten::layer_norm) against torch's, each a forward and a backward to the input, weight and bias
(torch.autograd.grad), on the tensors the models normalize (the ViT's tokens [128 * 17, 32],
the attention models' [128 * 28, 32] and [128 * 16, 32], a ConvNeXt stage's pixels
[128 * 49, 32] and [128 * 9, 64]): fp32, and bf16 inputs under autocast, where torch's side is
what autocast runs (the input copied to fp32, LayerNorm in fp32, the gradient copied back to
bf16; torch 1.13's eager autocast refuses a bf16 input to layer_norm, so the copy is written
out). In one process, alternating; median, min and max of each side over --reps rounds of
--calls calls, and the ratio; the results are checked against each other every round.

    PYTHONPATH=build/python /usr/bin/python3 bench/layer_norm.py [--reps 5] [--calls 50] [--threads 2]

Run it on a quiet machine: the load average is printed at start and end.
"""
from functools import partial

import torch
import torch.nn.functional as F

import afterburner  # noqa: F401  (loads torch.ops.afterburner)
from machine import cpu_description, load_description
from op_timing import alternating_times, arguments, cells

SHAPES = {"ViT tokens [2176, 32]": (2176, 32), "attention [3584, 32]": (3584, 32),
          "ConvNeXt [6272, 32]": (6272, 32), "ConvNeXt [1152, 64]": (1152, 64)}
EPS = 1e-6


def torch_layer_norm(x, weight, bias):
    return F.layer_norm(x.float(), weight.shape, weight, bias, EPS)


def our_layer_norm(x, weight, bias):
    return torch.ops.afterburner.layer_norm(x, list(weight.shape), weight, bias, EPS)


def autocast_for(layer_norm, x):
    """Ours under autocast for a bf16 input (as in a model's step); torch's outside it."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=layer_norm is our_layer_norm and x.dtype == torch.bfloat16)


def forward_backward(layer_norm, x, weight, bias, dy):
    with autocast_for(layer_norm, x):
        return torch.autograd.grad(layer_norm(x, weight, bias), (x, weight, bias), dy)


def agree(ours, theirs, dtype):
    bound = 1e-4 if dtype == torch.float32 else 1 / 64
    return all(((o.double() - t.double()).abs() <= bound * t.double().abs().max().clamp_min(1)).all()
               for o, t in zip(ours, theirs))


def main():
    args = arguments(__doc__)
    torch.set_num_threads(args.threads)
    print(f"{cpu_description()}; {args.threads} threads; {load_description()}")
    print(f"{'rows x features':24} {'input':9} {'torch forward+backward ms':>26} {'afterburner ms':>24} {'ratio':>6}")
    sides = {"torch": torch_layer_norm, "ours": our_layer_norm}
    for name, shape in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(shape).to(dtype).requires_grad_()
            weight = torch.randn(shape[1]).requires_grad_()
            bias = torch.randn(shape[1]).requires_grad_()
            tensors = (x, weight, bias, torch.randn(shape))

            def check():
                assert agree(forward_backward(our_layer_norm, *tensors), forward_backward(torch_layer_norm, *tensors),
                             dtype)

            calls = {side: partial(forward_backward, layer_norm, *tensors) for side, layer_norm in sides.items()}
            times = alternating_times(calls, check, args.reps, args.calls)
            torch_cell, our_cell, ratio = cells(times, 24)
            print(f"{name:24} {str(dtype).split('.')[1]:9} {torch_cell:>26} {our_cell} {ratio:5.2f}x")
    print(f"at the end: {load_description()}")


if __name__ == "__main__":
    main()
