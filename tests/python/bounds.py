"""How close afterburner's answers must be to Python's.

Tolerances, as `afterburner optimize` verifies by default, against the scale
of Python's outputs (their largest magnitude: a few-step EfficientNet-B0's logits reach the
thousands): fp32 stages within 1e-4 + 1e-4 of it (the same float math reassociated: oneDNN's
convolutions and GEMMs, BatchNorm folded into convolutions; observed up to 1e-5 of it); bf16
rounds every layer's inputs and weights to 8 significant bits, so within 0.05 + 5% of it
(observed up to 3.2%, where Python's own bf16 autocast moves 4.9%), or within twice what
Python's own bf16 autocast moves the same model's outputs on the test inputs where that is more:
a few-step model whose BatchNorm statistics have not settled can be chaotic in bf16 (an
EfficientNet-B0 trained channels_last moved 5% under Python's autocast, NCHW 33%), and no bf16
can be held closer to fp32 than Python's own.
"""
import torch

BOUNDS = {"fp32": (1e-4, 1e-4), "bf16": (0.05, 0.05)}  # (absolute, fraction of the outputs' scale)


def python_bf16(model, inputs):
    """(the largest difference Python's own bf16 autocast makes to `model`'s outputs on `inputs`,
    the fraction of their top-1 it keeps); (0, 1) where 1.13's autocast cannot run the model (its
    attention's evaluation fast path fails)."""
    with torch.no_grad():
        exact = model(inputs)
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                rounded = model(inputs).float()
        except RuntimeError:
            return 0.0, 1.0
    return (rounded - exact).abs().max().item(), (rounded.argmax(1) == exact.argmax(1)).float().mean().item()


def expect_python(answer, expected, precision, bf16_moves=0.0):
    assert answer.shape == expected.shape
    absolute, relative = BOUNDS[precision]
    scale = expected.abs().max().item()
    difference = (answer - expected).abs().max().item()
    bound = absolute + relative * scale
    if precision == "bf16":
        bound = max(bound, 2 * bf16_moves)
    assert difference <= bound, (
        f"{precision} differs from Python by {difference:.4g} (outputs' scale {scale:.4g}, Python's own bf16 moves "
        f"them {bf16_moves:.4g})")
