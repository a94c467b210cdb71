"""Fused layers with torch.nn's parameter names, and `fuse`, which puts them into your model.

    from afterburner import nn as abnn
    fc = abnn.LinearReLU(3136, 128)          # torch.nn.Linear's parameters and initialisation
    report = abnn.fuse(model)                 # in place; parameters and state_dict keys unchanged
    print(report.fused, report.notices)
"""
import dataclasses
from typing import List

import torch
from torch import Tensor

from . import functional

__all__ = ["SKLinear", "ReluMaxPool2d", "LinearReLU", "Conv2dReLU", "fuse", "FuseReport", "functional"]


class SKLinear(torch.nn.Module):
    """A dense layer as a sum of `num_terms` sketched terms of rank `low_rank` (Panther's SKLinear).

    y = 1/(2L) sum_i [(x S1s[i]) U1s[i] + (x U2s[i]) S2s[i]] + bias, run as two GEMMs.
    Parameters S1s [L, in, k] and S2s [L, k, out], buffers U1s [L, k, out] and U2s [L, in, k]
    (fixed signs +-1/sqrt(k)) and bias [out]: the names and shapes of panther.nn.SKLinear, so
    its state_dicts load. W_init ([out, in], torch.nn.Linear's layout) starts the layer as an
    unbiased estimate of that weight; without it, of a weight drawn as torch.nn.Linear draws it.
    """

    __constants__ = ["in_features", "out_features", "num_terms", "low_rank"]

    def __init__(self, in_features: int, out_features: int, num_terms: int, low_rank: int, W_init=None,
                 bias: bool = True, dtype=None, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.num_terms, self.low_rank = num_terms, low_rank
        if W_init is not None:
            W_init = W_init.detach().to("cpu", torch.float32)
        S1s, S2s, U1s, U2s, b = torch.ops.afterburner.sklinear_init(in_features, out_features, num_terms, low_rank,
                                                                     W_init, bias)
        factory = dict(dtype=dtype, device=device)
        self.register_buffer("U1s", U1s.to(**factory))
        self.register_buffer("U2s", U2s.to(**factory))
        self.S1s = torch.nn.Parameter(S1s.to(**factory))
        self.S2s = torch.nn.Parameter(S2s.to(**factory))
        if bias:
            self.bias = torch.nn.Parameter(b.to(**factory))
        else:
            self.register_parameter("bias", None)

    def forward(self, input: Tensor) -> Tensor:
        return torch.ops.afterburner.sklinear(input, self.S1s, self.S2s, self.U1s, self.U2s, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, num_terms={self.num_terms}, "
                f"low_rank={self.low_rank}, bias={self.bias is not None}")


class ReluMaxPool2d(torch.nn.MaxPool2d):
    """ReLU followed by torch.nn.MaxPool2d (its arguments), fused; return_indices is not supported."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.return_indices:
            raise ValueError("ReluMaxPool2d: return_indices=True is not supported")

    def forward(self, input: Tensor) -> Tensor:
        return functional.relu_max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation,
                                          self.ceil_mode)


class LinearReLU(torch.nn.Linear):
    """torch.nn.Linear followed by ReLU, fused: the same parameters, initialisation and state_dict."""

    def forward(self, input: Tensor) -> Tensor:
        return functional.linear_relu(input, self.weight, self.bias)


class Conv2dReLU(torch.nn.Conv2d):
    """torch.nn.Conv2d followed by ReLU, fused (zero padding given as numbers)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        reason = _conv_unsupported(self)
        if reason:
            raise ValueError(f"Conv2dReLU: {reason}")

    def forward(self, input: Tensor) -> Tensor:
        return functional.conv2d_relu(input, self.weight, self.bias, self.stride, self.padding, self.dilation,
                                      self.groups)


@dataclasses.dataclass
class FuseReport:
    fused: List[str]    # one entry per rewrite, e.g. "features.0-1: Conv2d + ReLU"
    notices: List[str]  # patterns left unfused, each with its reason


def fuse(module: torch.nn.Module) -> FuseReport:
    """Rewrites the fusable neighbours of every torch.nn.Sequential in `module` (nested ones too).

    ReLU, MaxPool2d -> Identity, ReluMaxPool2d; Linear, ReLU -> LinearReLU, Identity; Conv2d,
    ReLU -> Conv2dReLU, Identity (not where that ReLU fuses with a following MaxPool2d instead).
    Layers are replaced position for position over the same parameter tensors, so the
    state_dict's keys and an optimizer built before fusing stay valid. Layers inside modules
    with their own forward are left as they are: fuse only sees Sequential's order.
    """
    report = FuseReport([], [])
    for name, child in list(module.named_modules()):
        if isinstance(child, torch.nn.Sequential):
            _fuse_sequential(name, child, report)
    return report


def _fuse_sequential(name: str, sequence: torch.nn.Sequential, report: FuseReport) -> None:
    layers = list(sequence._modules.items())
    prefix = f"{name}." if name else ""
    i = 0
    while i + 1 < len(layers):
        (first_key, first), (second_key, second) = layers[i], layers[i + 1]
        following = layers[i + 2][1] if i + 2 < len(layers) else None
        where = f"{prefix}{first_key}-{second_key}"
        replacement = _fused_pair(first, second, following, where, report)
        if replacement is None:
            i += 1
            continue
        sequence._modules[first_key], sequence._modules[second_key] = replacement
        report.fused.append(f"{where}: {type(first).__name__} + {type(second).__name__}")
        i += 2


def _fused_pair(first, second, following, where: str, report: FuseReport):
    if type(first) is torch.nn.ReLU and type(second) is torch.nn.MaxPool2d:
        if second.return_indices:
            report.notices.append(f"{where}: ReLU + MaxPool2d left unfused: return_indices=True")
            return None
        pool = ReluMaxPool2d(second.kernel_size, second.stride, second.padding, second.dilation,
                             ceil_mode=second.ceil_mode)
        return torch.nn.Identity(), pool
    if type(second) is not torch.nn.ReLU:
        return None
    if type(first) is torch.nn.Linear:
        fused = LinearReLU(first.in_features, first.out_features, first.bias is not None, device="meta")
        return _sharing_parameters(fused, first), torch.nn.Identity()
    if type(first) is torch.nn.Conv2d:
        if type(following) is torch.nn.MaxPool2d and not following.return_indices:
            return None  # the ReLU goes with the pooling, which applies it to a quarter of the values
        reason = _conv_unsupported(first)
        if reason:
            report.notices.append(f"{where}: Conv2d + ReLU left unfused: {reason}")
            return None
        fused = Conv2dReLU(first.in_channels, first.out_channels, first.kernel_size, first.stride, first.padding,
                           first.dilation, first.groups, first.bias is not None, device="meta")
        return _sharing_parameters(fused, first), torch.nn.Identity()
    return None


def _sharing_parameters(fused: torch.nn.Module, layer: torch.nn.Module) -> torch.nn.Module:
    """`fused` (built on the meta device, so nothing was drawn) over `layer`'s own parameters."""
    for name, parameter in layer.named_parameters(recurse=False):
        setattr(fused, name, parameter)
    fused.train(layer.training)
    return fused


def _conv_unsupported(conv: torch.nn.Conv2d) -> str:
    if conv.padding_mode != "zeros":
        return f"padding_mode '{conv.padding_mode}' (only zeros)"
    if isinstance(conv.padding, str):
        return f"padding '{conv.padding}' (give it as numbers)"
    return ""
