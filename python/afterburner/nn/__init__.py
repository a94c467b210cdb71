"""Fused layers with torch.nn's parameter names, and `fuse`, which puts them into your model.

    from afterburner import nn as abnn
    fc = abnn.LinearReLU(3136, 128)          # torch.nn.Linear's parameters and initialisation
    report = abnn.fuse(model)                 # in place; parameters and state_dict keys unchanged
    print(report.fused, report.notices)
"""
import dataclasses
from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor

from . import functional

__all__ = ["SKLinear", "SKConv2d", "RandMultiHeadAttention", "make_performer", "ReluMaxPool2d", "LinearReLU", "Conv2dReLU", "fuse", "FuseReport", "functional"]


class SKLinear(torch.nn.Module):
    """A dense layer as a sum of `num_terms` sketched terms of rank `low_rank` (Panther's SKLinear).

    y = 1/(2L) sum_i [(x S1s[i]) U1s[i] + (x U2s[i]) S2s[i]] + bias, run as two GEMMs.
    Parameters S1s [L, in, k] and S2s [L, k, out], buffers U1s [L, k, out] and U2s [L, in, k]
    (fixed signs +-1/sqrt(k)) and bias [out]: the names and shapes of panther.nn.SKLinear, so
    its state_dicts load. W_init ([out, in], torch.nn.Linear's layout) starts the layer as an
    unbiased estimate of that weight; without it, of a weight drawn as torch.nn.Linear draws it.
    relu=True and dropout=p apply ReLU and then dropout (in training) to the output in the same
    autograd node, what a following torch.nn.ReLU and torch.nn.Dropout(p) compute, the same bits
    from the same seed (`fuse` puts them here).
    """

    __constants__ = ["in_features", "out_features", "num_terms", "low_rank", "relu", "dropout"]

    def __init__(self, in_features: int, out_features: int, num_terms: int, low_rank: int, W_init=None,
                 bias: bool = True, dtype=None, device=None, relu: bool = False, dropout: float = 0.0):
        super().__init__()
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"SKLinear dropout: must be between 0 and 1, got {dropout}")
        self.in_features, self.out_features = in_features, out_features
        self.num_terms, self.low_rank = num_terms, low_rank
        self.relu, self.dropout = relu, float(dropout)
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
        if not torch.jit.is_scripting() and self._factors_can_stay():
            return torch.ops.afterburner.sklinear_factored(input, *self._kept_factors(), self.bias, self.relu,
                                                           self.dropout, self.training)
        return torch.ops.afterburner.sklinear(input, self.S1s, self.S2s, self.U1s, self.U2s, self.bias, self.relu,
                                              self.dropout, self.training)

    # Where no gradient is wanted for S1s and S2s (inference), the GEMMs' operands are made once
    # and reused while the four tensors are the same ones, unchanged (their version counters), as
    # the C++ SKLinear does: remaking them is two copies of the weights per call.
    @torch.jit.unused
    def _factors_can_stay(self) -> bool:
        sources = (self.S1s, self.S2s, self.U1s, self.U2s)
        if (torch.is_grad_enabled() and (self.S1s.requires_grad or self.S2s.requires_grad)) or \
                any(t.is_inference() for t in sources):  # inference tensors keep no version counter
            self.__dict__.pop("_factors", None)
            return False
        return True

    @torch.jit.unused
    def _kept_factors(self) -> Tuple[Tensor, Tensor, float]:
        sources = (self.S1s, self.S2s, self.U1s, self.U2s)
        key = tuple((t.data_ptr(), t._version) for t in sources) + (torch.is_inference_mode_enabled(),)
        kept = self.__dict__.get("_factors")
        if kept is None or kept[1] != key or any(a is not b for a, b in zip(kept[0], sources)):
            kept = (sources, key, torch.ops.afterburner.sklinear_factors(*sources))
            self.__dict__["_factors"] = kept
        return kept[2]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, num_terms={self.num_terms}, "
                f"low_rank={self.low_rank}, bias={self.bias is not None}" + (", relu=True" if self.relu else "") +
                (f", dropout={self.dropout}" if self.dropout else ""))


class SKConv2d(torch.nn.Module):
    """A 2-D convolution as 2 * `num_terms` sketched terms of rank `low_rank` (Panther's SKConv2d).

    y = 1/(2L) sum_{i, kappa} U1s[i, kappa, :] conv2d(x, S1s[i k + kappa]) + bias: one convolution
    to 2Lk channels, then one fixed 1x1 mix down to out_channels. Parameter S1s [2Lk, in_channels,
    Kh, Kw], buffer U1s [2L, k, out_channels] (fixed signs +-1/sqrt(k)) and bias [out_channels]:
    the names and shapes of panther.nn.SKConv2d, so its state_dicts load. padding takes numbers,
    "valid", or "same" (odd kernel sizes: (K - 1) // 2 on each side, Panther's meaning). `layer`
    (a torch.nn.Conv2d) starts the layer as an unbiased estimate of that convolution and takes its
    bias; without it, of a kernel drawn as torch.nn.Conv2d draws it.
    """

    __constants__ = ["in_channels", "out_channels", "num_terms", "low_rank", "stride", "padding"]

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Union[int, Tuple[int, int]] = (3, 3),
                 stride: Union[int, Tuple[int, int]] = (1, 1), padding: Union[str, int, Tuple[int, int]] = (1, 1),
                 bias: bool = True, num_terms: int = 6, low_rank: int = 8,
                 layer: Optional[torch.nn.Conv2d] = None, dtype=None, device=None):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.num_terms, self.low_rank = num_terms, low_rank
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = _sketch_padding(padding, self.kernel_size)
        weight = None
        if layer is not None:
            reason = _sketch_unsupported(layer)
            if reason:
                raise ValueError(f"SKConv2d layer: {reason}")
            weight = layer.weight.detach().to("cpu", torch.float32)
            bias = layer.bias is not None
        S1s, U1s, b = torch.ops.afterburner.skconv2d_init(in_channels, out_channels, self.kernel_size, num_terms,
                                                          low_rank, weight, bias)
        factory = dict(dtype=dtype, device=device)
        self.register_buffer("U1s", U1s.to(**factory))
        self.S1s = torch.nn.Parameter(S1s.to(**factory))
        if not bias:
            self.register_parameter("bias", None)
        elif layer is not None:
            self.bias = torch.nn.Parameter(layer.bias.detach().to(**factory).clone())
        else:
            self.bias = torch.nn.Parameter(b.to(**factory))

    @staticmethod
    def fromTorch(layer: torch.nn.Conv2d, num_terms: int, low_rank: int) -> "SKConv2d":
        """The sketched estimate of `layer` with its sizes, stride, padding and bias (Panther's name)."""
        if not isinstance(layer, torch.nn.Conv2d):
            raise ValueError(f"SKConv2d.fromTorch: expected a torch.nn.Conv2d, got {type(layer).__name__}")
        return SKConv2d(layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride, layer.padding,
                        num_terms=num_terms, low_rank=low_rank, layer=layer, dtype=layer.weight.dtype,
                        device=layer.weight.device)

    def forward(self, input: Tensor) -> Tensor:
        return torch.ops.afterburner.skconv2d(input, self.S1s, self.U1s, self.bias, self.stride, self.padding)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, num_terms={self.num_terms}, low_rank={self.low_rank}, "
                f"bias={self.bias is not None}")


class RandMultiHeadAttention(torch.nn.Module):
    """Multi-head attention with random features in place of the softmax (Performer's FAVOR+, as
    panther.nn.RandMultiHeadAttention): linear in the sequence length, batch first.

    forward(query [B, L, E], key, value [B, S, E], attention_mask=None) -> (out [B, L, E], None).
    Parameters Wq, Wk, Wv, W0 [E, E] (torch.nn.Linear's layout), bq, bk, bv, b0 [E], buffer
    projection_matrix [num_random_features, E // num_heads]: Panther's names, so its state_dicts
    load. kernel_fn "softmax" (features estimating exp(q.k / sqrt(d))) or "relu". iscausal: query i
    sees keys 0..i. dropout (in training) drops whole keys of a head, scaled by 1 / (1 - p), the
    normaliser unchanged: nn.MultiheadAttention's expectation without the [L, S] weights.
    attention_mask: bool [B, L, S], true = may attend (Panther's meaning), of whole query rows and
    key columns only (padding). The projection is drawn from a generator of its own seeded by
    `seed` (None: a seed drawn from torch's generator, which is never reseeded).
    """

    __constants__ = ["embed_dim", "num_heads", "dropout", "kernel_fn", "causal"]

    def __init__(self, embed_dim: int, num_heads: int, num_random_features: int, dropout: float = 0.0,
                 bias: bool = True, kernel_fn: str = "softmax", iscausal: bool = False, device=None, dtype=None,
                 seed: Optional[int] = None):
        super().__init__()
        if num_heads <= 0 or embed_dim <= 0 or embed_dim % num_heads != 0:
            raise ValueError(f"RandMultiHeadAttention num_heads: must be positive and divide embed_dim {embed_dim}, "
                             f"got {num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"RandMultiHeadAttention dropout: must be in [0, 1), got {dropout}")
        if kernel_fn not in ("softmax", "relu"):
            raise ValueError(f"RandMultiHeadAttention kernel_fn: expected 'softmax' or 'relu', got '{kernel_fn}'")
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.bias, self.kernel_fn, self.causal = bias, kernel_fn, iscausal
        if seed is None:
            seed = int(torch.randint(0, 2**63 - 1, (1,)).item())
        self.seed = seed
        factory = dict(dtype=dtype, device=device)
        for name in ("Wq", "Wk", "Wv", "W0"):
            setattr(self, name, torch.nn.Parameter(torch.empty(embed_dim, embed_dim, **factory)))
        for name in ("bq", "bk", "bv", "b0"):
            if bias:
                setattr(self, name, torch.nn.Parameter(torch.empty(embed_dim, **factory)))
            else:
                self.register_parameter(name, None)
        projection = torch.ops.afterburner.orthogonal_random_features(num_random_features, embed_dim // num_heads,
                                                                      seed)
        self.register_buffer("projection_matrix", projection.to(**factory))
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        for weight in (self.Wq, self.Wk, self.Wv, self.W0):
            torch.nn.init.xavier_uniform_(weight)
        for bias in (self.bq, self.bk, self.bv, self.b0):
            if bias is not None:
                torch.nn.init.zeros_(bias)

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                attention_mask: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
        out = torch.ops.afterburner.rand_mha(query, key, value, self.Wq, self.Wk, self.Wv, self.W0, self.bq, self.bk,
                                             self.bv, self.b0, self.projection_matrix, self.num_heads, self.kernel_fn,
                                             self.causal, self.dropout, self.training, attention_mask)
        return out, None

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"num_random_features={self.projection_matrix.shape[0]}, dropout={self.dropout}, bias={self.bias}, "
                f"kernel_fn={self.kernel_fn}, iscausal={self.causal}")


def make_performer(mha: torch.nn.MultiheadAttention, num_random_features: int, kernel_fn: str = "softmax",
                   iscausal: bool = False, seed: Optional[int] = None) -> RandMultiHeadAttention:
    """A RandMultiHeadAttention with `mha`'s weights (copies of in_proj's three blocks and out_proj) and
    its dropout (Panther's converter). The result takes batch-first inputs whatever mha.batch_first says."""
    if not isinstance(mha, torch.nn.MultiheadAttention):
        raise ValueError(f"make_performer: expected a torch.nn.MultiheadAttention, got {type(mha).__name__}")
    if mha.in_proj_weight is None:
        raise ValueError("make_performer: keys and values of other sizes than the queries (kdim, vdim) are not "
                         "supported")
    if mha.bias_k is not None:
        raise ValueError("make_performer: add_bias_kv is not supported")
    e = mha.embed_dim
    weight = mha.in_proj_weight.detach()
    performer = RandMultiHeadAttention(e, mha.num_heads, num_random_features, mha.dropout,
                                       mha.in_proj_bias is not None, kernel_fn, iscausal, device=weight.device,
                                       dtype=weight.dtype, seed=seed)
    with torch.no_grad():
        for i, name in enumerate(("Wq", "Wk", "Wv")):
            getattr(performer, name).copy_(weight[i * e:(i + 1) * e])
        performer.W0.copy_(mha.out_proj.weight)
        if mha.in_proj_bias is not None:
            for i, name in enumerate(("bq", "bk", "bv")):
                getattr(performer, name).copy_(mha.in_proj_bias[i * e:(i + 1) * e])
            performer.b0.copy_(mha.out_proj.bias)
    return performer


def _pair(value) -> Tuple[int, int]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


def _sketch_padding(padding, kernel_size: Tuple[int, int]) -> Tuple[int, int]:
    if padding == "valid":
        return (0, 0)
    if padding == "same":
        if kernel_size[0] % 2 == 0 or kernel_size[1] % 2 == 0:
            raise ValueError(f"SKConv2d padding: 'same' needs odd kernel sizes, got {kernel_size}")
        return ((kernel_size[0] - 1) // 2, (kernel_size[1] - 1) // 2)
    if isinstance(padding, str):
        raise ValueError(f"SKConv2d padding: expected 'same', 'valid' or numbers, got '{padding}'")
    return _pair(padding)


def _sketch_unsupported(conv) -> str:
    if not isinstance(conv, torch.nn.Conv2d):
        return f"expected a torch.nn.Conv2d, got {type(conv).__name__}"
    if conv.groups != 1:
        return f"groups {conv.groups} (only 1)"
    if tuple(conv.dilation) != (1, 1):
        return f"dilation {tuple(conv.dilation)} (only 1)"
    if conv.padding_mode != "zeros":
        return f"padding_mode '{conv.padding_mode}' (only zeros)"
    return ""


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
    ReLU -> Conv2dReLU, Identity (not where that ReLU fuses with a following MaxPool2d instead);
    SKLinear, ReLU, Dropout (either or both) -> SKLinear(relu=..., dropout=p), Identity, ...
    Layers are replaced position for position over the same parameter tensors, so the
    state_dict's keys and an optimizer built before fusing stay valid. Layers inside modules
    with their own forward are left as they are: fuse only sees Sequential's order (for those,
    afterburner.jit.fuse rewrites the scripted forward).
    """
    report = FuseReport([], [])
    sequentials = [(name, child) for name, child in module.named_modules() if isinstance(child, torch.nn.Sequential)]
    for name, child in sequentials:
        _fuse_sequential(name, child, report)
    if not sequentials:
        report.notices.append(f"{type(module).__name__} holds no torch.nn.Sequential, whose order is all fuse sees: "
                              "afterburner.jit.fuse(torch.jit.script(model)) fuses a forward of its own")
    return report


def _fuse_sequential(name: str, sequence: torch.nn.Sequential, report: FuseReport) -> None:
    layers = list(sequence._modules.items())
    prefix = f"{name}." if name else ""
    i = 0
    while i + 1 < len(layers):
        (first_key, first), (second_key, second) = layers[i], layers[i + 1]
        following = layers[i + 2][1] if i + 2 < len(layers) else None
        if type(first) is SKLinear:
            replacement = _sketched_with_epilogue(first, [module for _, module in layers[i + 1:i + 3]])
        else:
            replacement = _fused_pair(first, second, following, f"{prefix}{first_key}-{second_key}", report)
        if replacement is None:
            i += 1
            continue
        replaced = layers[i:i + len(replacement)]
        for (key, _), module in zip(replaced, replacement):
            sequence._modules[key] = module
        report.fused.append(f"{prefix}{replaced[0][0]}-{replaced[-1][0]}: " +
                            " + ".join(type(module).__name__ for _, module in replaced))
        i += len(replacement)


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


def _sketched_with_epilogue(layer: SKLinear, following: List[torch.nn.Module]):
    """(layer with the ReLU and Dropout that follow it, Identity for each), or None if none does."""
    relu, dropout, taken = layer.relu, layer.dropout, 0
    if relu or dropout:
        return None
    if taken < len(following) and type(following[taken]) is torch.nn.ReLU:
        relu, taken = True, taken + 1
    if taken < len(following) and type(following[taken]) is torch.nn.Dropout:
        dropout, taken = following[taken].p, taken + 1
    if taken == 0:
        return None
    fused = SKLinear.__new__(SKLinear)  # nothing drawn: the layer's own tensors
    torch.nn.Module.__init__(fused)
    fused.in_features, fused.out_features = layer.in_features, layer.out_features
    fused.num_terms, fused.low_rank = layer.num_terms, layer.low_rank
    fused.relu, fused.dropout = relu, float(dropout)
    for name, buffer in layer.named_buffers(recurse=False):
        fused.register_buffer(name, buffer)
    for name in ("S1s", "S2s", "bias"):
        fused.register_parameter(name, getattr(layer, name))
    fused.train(layer.training)
    return (fused,) + tuple(torch.nn.Identity() for _ in range(taken))


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
