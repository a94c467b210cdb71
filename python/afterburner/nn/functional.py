"""afterburner's fused ops in torch.nn.functional's style: same arguments, same results.

Each function is scriptable and calls one op, torch.ops.afterburner.<name>, which has its own
backward (gradients flow as through the unfused torch ops).
"""
from typing import List, Optional

import torch
from torch import Tensor
from torch._jit_internal import BroadcastingList2

__all__ = ["relu_max_pool2d", "linear_relu", "conv2d_relu", "cross_entropy", "low_rank_linear", "attention"]


def relu_max_pool2d(input: Tensor, kernel_size: BroadcastingList2[int], stride: Optional[BroadcastingList2[int]] = None,
                    padding: BroadcastingList2[int] = 0, dilation: BroadcastingList2[int] = 1,
                    ceil_mode: bool = False) -> Tensor:
    """max_pool2d(relu(input)) with max_pool2d's arguments; square windows run in one pass keeping a
    byte per output for backward, others as relu then max_pool2d."""
    if stride is None:
        stride = torch.jit.annotate(List[int], [])
    return torch.ops.afterburner.relu_max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode)


def linear_relu(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """relu(linear(input, weight, bias)), keeping only the output for backward."""
    return torch.ops.afterburner.linear_relu(input, weight, bias)


def conv2d_relu(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: BroadcastingList2[int] = 1,
                padding: BroadcastingList2[int] = 0, dilation: BroadcastingList2[int] = 1, groups: int = 1) -> Tensor:
    """relu(conv2d(input, weight, bias, stride, padding, dilation, groups)), zero padding, ReLU in place."""
    return torch.ops.afterburner.conv2d_relu(input, weight, bias, stride, padding, dilation, groups)


def cross_entropy(input: Tensor, target: Tensor) -> Tensor:
    """cross_entropy(input, target), mean over rows: class indices, no weights, no smoothing."""
    return torch.ops.afterburner.cross_entropy(input, target)


def low_rank_linear(input: Tensor, a: Tensor, b: Tensor, bias: Optional[Tensor] = None, scale: float = 1.0) -> Tensor:
    """scale * (input @ a) @ b + bias, never forming a @ b."""
    return torch.ops.afterburner.low_rank_linear(input, a, b, bias, scale)


def attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None, is_causal: bool = False,
              scale: Optional[float] = None) -> Tensor:
    """softmax(query @ key^T * scale + attn_mask) @ value, as torch 2.x's scaled_dot_product_attention
    without dropout: query [..., L, E], key [..., S, E], value [..., S, Ev] -> [..., L, Ev]; a bool
    attn_mask is True where a query attends, a float one is added; is_causal lets query i see keys
    0..i; scale defaults to 1/sqrt(E). Tiled with an online softmax: no [L, S] matrix is kept. A
    row that sees no key is NaN, as softmax of all -inf is."""
    return torch.ops.afterburner.attention(query, key, value, attn_mask, is_causal, scale)
