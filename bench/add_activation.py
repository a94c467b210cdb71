#!/usr/bin/python3
"""A residual sum and its activation in training: torch.ops.afterburner.add_activation (what the
fuse rewrite puts in the place of `relu(a + b)` and `silu(a + b)`) against torch's two ops as
eager Python runs them, each a forward and a backward (torch.autograd.grad to both terms), on
the tensors the models add: the issue-25 model's residual block ([128, 16, 14, 14], SiLU) and
ResNet-18's first stages on 28 px images ([128, 64, 7, 7] and [128, 128, 4, 4], ReLU), channels
last, in fp32 and bf16 (what autocast leaves them in: both ops keep their inputs' dtype), in one
process keeping freed memory (as both training loops run), alternating; median, min and max of
each side over --reps rounds of --calls calls, and the ratio. Both sides' answers are checked
every round against the two ops in double on the sum rounded to the dtype (bf16: within 4
roundings, as LibTorch 1.13's bf16 SiLU rounds after each step of its formula).

    PYTHONPATH=build/python /usr/bin/python3 bench/add_activation.py [--reps 5] [--calls 50] [--threads 2]

Run it on a quiet machine: the load average is printed at start and end.
"""
from functools import partial

import torch
import torch.nn.functional as F

import afterburner
from machine import cpu_description, load_description
from op_timing import alternating_times, arguments, cells

CASES = {"issue-25 block [128, 16, 14, 14]": ((128, 16, 14, 14), "silu"),
         "ResNet-18 layer1 [128, 64, 7, 7]": ((128, 64, 7, 7), "relu"),
         "ResNet-18 layer2 [128, 128, 4, 4]": ((128, 128, 4, 4), "relu")}
EAGER = {"silu": F.silu, "relu": torch.relu}


def forward_backward(add_activation, a, b, dy):
    y = add_activation(a, b)
    return (y,) + torch.autograd.grad(y, (a, b), dy)


def reference(activation, a, b, dy):
    """The output and gradient in double from the sum as the dtype holds it."""
    s = (a.double() + b.double()).to(a.dtype).double().requires_grad_()
    y = EAGER[activation](s)
    return (y,) + torch.autograd.grad(y, s, dy.double())


def main():
    args = arguments(__doc__)
    torch.set_num_threads(args.threads)
    afterburner.heap.keep_freed_memory()
    print(f"{cpu_description()}; {args.threads} threads; {load_description()}")
    print(f"{'tensor':36} {'dtype':9} {'torch forward+backward ms':>26} {'afterburner ms':>24} {'ratio':>6}")
    for name, (shape, activation) in CASES.items():
        sides = {"torch": lambda a, b: EAGER[activation](a + b),
                 "ours": lambda a, b: torch.ops.afterburner.add_activation(a, b, activation)}
        for dtype in (torch.float32, torch.bfloat16):
            a, b, dy = (torch.randn(shape).to(dtype).contiguous(memory_format=torch.channels_last) for _ in range(3))
            a.requires_grad_(), b.requires_grad_()

            def check():
                expected_y, expected_grad = reference(activation, a, b, dy)
                bound = 1e-5 if dtype == torch.float32 else 4 / 128
                for side in sides.values():
                    y, grad_a, grad_b = forward_backward(side, a, b, dy)
                    for answer, expected in ((y, expected_y), (grad_a, expected_grad), (grad_b, expected_grad)):
                        assert ((answer.double() - expected).abs() <= bound * expected.abs().clamp_min(1)).all()

            calls = {side: partial(forward_backward, op, a, b, dy) for side, op in sides.items()}
            times = alternating_times(calls, check, args.reps, args.calls)
            torch_cell, our_cell, ratio = cells(times, 24)
            print(f"{name:36} {str(dtype).split('.')[1]:9} {torch_cell:>26} {our_cell} {ratio:5.2f}x")
    print(f"at the end: {load_description()}")


if __name__ == "__main__":
    main()
