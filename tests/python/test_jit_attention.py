"""afterburner.jit.fuse (and so `train --model`) rewrites scripted nn.MultiheadAttention onto the
fused attention: outputs, weights and gradients as the module's own, in double to 1e-10 and in
float, for self-, cross- and separate-input attention, batch_first or not, every mask MHA takes,
at batch 1, 3 and 64, twice. The cases the fused op does not compute as MHA does run MHA's own
code (the profiler shows which ran), so their answers and errors are MHA's; bf16 autocast, where
the scripted module fails in LibTorch 1.13, works."""
from typing import Optional

import pytest
import torch
from torch import Tensor

from afterburner import jit

EMBED, HEADS, LENGTH, SOURCE = 16, 4, 7, 5


class SelfAttention(torch.nn.Module):
    def __init__(self, need_weights=True, average=True, **options):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(EMBED, HEADS, **options)
        self.need_weights = need_weights
        self.average = average

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor] = None, attn_mask: Optional[Tensor] = None):
        return self.attention(x, x, x, key_padding_mask=key_padding_mask, need_weights=self.need_weights,
                              attn_mask=attn_mask, average_attn_weights=self.average)


class CrossAttention(SelfAttention):
    """Queries from one sequence, keys and values (one tensor) from another."""

    def forward(self, x: Tensor, memory: Tensor, key_padding_mask: Optional[Tensor] = None,
                attn_mask: Optional[Tensor] = None):
        return self.attention(x, memory, memory, key_padding_mask=key_padding_mask, need_weights=self.need_weights,
                              attn_mask=attn_mask, average_attn_weights=self.average)


class SeparateInputs(SelfAttention):
    def forward(self, x: Tensor, memory: Tensor, key_padding_mask: Optional[Tensor] = None,
                attn_mask: Optional[Tensor] = None):
        return self.attention(x, memory, memory * 2, key_padding_mask=key_padding_mask,
                              need_weights=self.need_weights, attn_mask=attn_mask, average_attn_weights=self.average)


class WeightsDropped(torch.nn.Module):
    """As users write it: the weights asked for (MHA's default) and thrown away."""

    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(EMBED, HEADS, batch_first=True)
        self.head = torch.nn.Linear(EMBED, 3)

    def forward(self, x):
        attended, _ = self.attention(x, x, x)
        return self.head((x + attended).mean(1))


def sequences(batch, length, batch_first, dtype):
    shape = (batch, length, EMBED) if batch_first else (length, batch, EMBED)
    return torch.randn(shape, dtype=dtype, requires_grad=True)


def masks(kind, batch, length, source, dtype):
    """(key_padding_mask, attn_mask) of `kind`."""
    padding = torch.zeros(batch, source, dtype=torch.bool)
    padding[-1, source - 2:] = True  # the last sequence's last two keys are padding
    causal = torch.ones(length, source, dtype=torch.bool).triu(1)  # True = not attended, as MHA reads it
    per_head = torch.rand(batch * HEADS, length, source) < 0.3
    per_head[..., 0] = False  # every query sees a key
    additive = torch.randn(length, source, dtype=dtype)
    return {
        "none": (None, None),
        "padding bool": (padding, None),
        "padding float": (torch.zeros(batch, source, dtype=dtype).masked_fill(padding, float("-inf")), None),
        "causal bool": (None, causal),
        "additive 2-D": (None, additive),
        "per head bool": (None, per_head),
        "causal and padding": (padding, causal),
        "additive and padding": (padding, additive),
        "a sequence of padding only": (torch.ones(batch, source, dtype=torch.bool), None),  # NaN, as MHA's softmax
    }[kind]


def ran_fused(call):
    with torch.autograd.profiler.profile() as profile:
        result = call()
    return result, any(event.name == "afterburner::attention" for event in profile.function_events)


def check_as_module(model, inputs, kind, dtype, batch, tolerance):
    module = torch.jit.script(model.to(dtype))
    fused, report = jit.fuse(module)
    assert report.fused == ["1 x multi-head attention", "3 x dropout"], report  # MHA's code and the fused path's
    key_padding_mask, attn_mask = masks(kind, batch, LENGTH, inputs[-1].shape[0 if not model.attention.batch_first
                                                                                    else 1], dtype)
    arguments = (*inputs, key_padding_mask, attn_mask)
    parameters = list(module.parameters())
    for _ in range(2):  # a second call gives the same answer
        (got, got_weights), fused_ran = ran_fused(lambda: fused(*arguments))
        want, want_weights = module(*arguments)
        assert fused_ran
        torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance, equal_nan=True)
        if want_weights is None:
            assert got_weights is None
        else:
            torch.testing.assert_close(got_weights, want_weights, atol=tolerance, rtol=tolerance, equal_nan=True)
        if kind == "a sequence of padding only":
            continue  # NaN everywhere
        seed = torch.randn_like(want)
        with_respect_to = [*inputs, *parameters]
        got_grads = torch.autograd.grad((got * seed).sum(), with_respect_to)
        want_grads = torch.autograd.grad((want * seed).sum(), with_respect_to)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, atol=tolerance * 10, rtol=tolerance * 10)


MASKS = ["none", "padding bool", "padding float", "causal bool", "additive 2-D", "per head bool",
         "causal and padding", "additive and padding", "a sequence of padding only"]


# No bias=False: LibTorch 1.13 cannot script such a MultiheadAttention (its forward reads
# in_proj_bias.dtype), so no user has one to hand us.
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("batch_first", [True, False])
def test_self_attention_as_the_module_in_double(mask, batch_first):
    torch.manual_seed(0)
    model = SelfAttention(batch_first=batch_first)
    check_as_module(model, [sequences(3, LENGTH, batch_first, torch.double)], mask, torch.double, 3, 1e-10)


@pytest.mark.parametrize("model_class", [CrossAttention, SeparateInputs])
@pytest.mark.parametrize("mask", ["none", "padding bool", "additive and padding", "per head bool"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_cross_attention_as_the_module_in_double(model_class, mask, batch_first):
    torch.manual_seed(0)
    model = model_class(batch_first=batch_first)
    inputs = [sequences(3, LENGTH, batch_first, torch.double), sequences(3, SOURCE, batch_first, torch.double)]
    check_as_module(model, inputs, mask, torch.double, 3, 1e-10)


@pytest.mark.parametrize("batch", [1, 3, 64])
@pytest.mark.parametrize("need_weights, average", [(True, True), (True, False), (False, True)])
def test_float_at_every_batch_and_weights_as_asked(batch, need_weights, average):
    torch.manual_seed(0)
    model = SelfAttention(need_weights=need_weights, average=average, batch_first=True)
    check_as_module(model, [sequences(batch, LENGTH, True, torch.float)], "padding bool", torch.float, batch, 2e-5)


def test_weights_the_caller_drops_are_not_computed():
    torch.manual_seed(0)
    module = torch.jit.script(WeightsDropped())
    fused, _ = jit.fuse(module)
    x = torch.randn(2, LENGTH, EMBED)
    with torch.autograd.profiler.profile() as profile:
        got = fused(x)
    names = {event.name for event in profile.function_events}
    assert "afterburner::attention" in names and "aten::softmax" not in names, names
    torch.testing.assert_close(got, module(x))


@pytest.mark.parametrize("options, call", [
    ({"add_zero_attn": True}, "eval"),
    ({"add_bias_kv": True}, "eval"),
    ({}, "unbatched"),
])
def test_what_the_fused_op_does_not_compute_runs_as_the_module(options, call):
    torch.manual_seed(0)
    module = torch.jit.script(SelfAttention(batch_first=True, **options))
    fused, _ = jit.fuse(module)
    x = torch.randn(LENGTH, EMBED) if call == "unbatched" else torch.randn(3, LENGTH, EMBED)
    module.train(call == "train"), fused.train(call == "train")
    torch.manual_seed(1)
    (got, got_weights), fused_ran = ran_fused(lambda: fused(x))
    torch.manual_seed(1)
    want, want_weights = module(x)
    assert not fused_ran
    assert torch.equal(got, want) and torch.equal(got_weights, want_weights)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("dtype, tolerance", [(torch.double, 1e-10), (torch.float, 1e-5)])
def test_dropout_of_the_weights_in_training_runs_fused_with_the_modules_masks(batch_first, dtype, tolerance):
    """MHA's dropout of its weights while training: fused, its noise drawn as MHA draws it, so
    that from one seed the output, the (dropped) weights and the gradients are the eager module's
    and the generator's next draws alike; in evaluation, no dropout."""
    torch.manual_seed(0)
    model = SelfAttention(batch_first=batch_first, dropout=0.3).to(dtype)
    fused, _ = jit.fuse(torch.jit.script(model))
    x = sequences(3, LENGTH, batch_first, dtype)
    parameters = list(fused.parameters())
    for _ in range(2):
        torch.manual_seed(1)
        (got, got_weights), fused_ran = ran_fused(lambda: fused(x))
        got_next = torch.rand(3)
        torch.manual_seed(1)
        want, want_weights = model(x)
        want_next = torch.rand(3)
        assert fused_ran and torch.equal(got_next, want_next)
        torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
        torch.testing.assert_close(got_weights, want_weights, atol=tolerance, rtol=tolerance)
        got_grads = torch.autograd.grad(got.square().sum(), [x, *parameters])
        want_grads = torch.autograd.grad(want.square().sum(), [x, *model.parameters()])
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, atol=10 * tolerance, rtol=10 * tolerance)
    fused.eval(), model.eval()
    (got, _), fused_ran = ran_fused(lambda: fused(x))
    assert fused_ran
    torch.testing.assert_close(got, model(x)[0], atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("arguments", [
    lambda x: (x, torch.zeros(3, SOURCE + 1, dtype=torch.bool), None),      # padding of the wrong length
    lambda x: (x, None, torch.zeros(LENGTH, LENGTH + 2, dtype=torch.bool)),  # attn_mask of the wrong shape
    lambda x: (x, None, torch.zeros(LENGTH, LENGTH, dtype=torch.int32)),    # attn_mask of another dtype
    lambda x: (x[..., :EMBED - 1], None, None),                             # a query of the wrong width
])
def test_bad_input_gets_the_module_own_error(arguments):
    torch.manual_seed(0)
    module = torch.jit.script(SelfAttention(batch_first=True))
    fused, _ = jit.fuse(module)
    x = torch.randn(3, LENGTH, EMBED)
    with pytest.raises(Exception) as expected:
        module(*arguments(x))
    with pytest.raises(type(expected.value)) as got:
        fused(*arguments(x))
    assert str(got.value).splitlines()[-1] == str(expected.value).splitlines()[-1]


def test_bf16_autocast_where_the_scripted_module_fails():
    torch.manual_seed(0)
    module = torch.jit.script(WeightsDropped()).eval()
    fused, _ = jit.fuse(module)
    x = torch.randn(5, LENGTH, EMBED)
    with torch.no_grad():
        want = module(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with pytest.raises(RuntimeError, match="expected scalar type BFloat16 but found Float"):
                module(x)  # LibTorch 1.13: MHA's fast path under CPU autocast
            got = fused(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0.05)


def test_a_traced_attention_stays_as_traced_and_says_so():
    torch.manual_seed(0)
    model = WeightsDropped()
    x = torch.randn(2, LENGTH, EMBED)
    traced = torch.jit.trace(model, x)
    fused, report = jit.fuse(traced)
    assert report.fused == [] and any("MultiheadAttention left unfused" in notice for notice in report.notices)
    torch.testing.assert_close(fused(x), model(x))


class Encoder(torch.nn.Module):
    def __init__(self, batch_first, norm_first):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(EMBED, HEADS, dim_feedforward=32, dropout=0.0,
                                                 batch_first=batch_first, norm_first=norm_first)
        self.encoder = torch.nn.TransformerEncoder(layer, 2)

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor] = None):
        return self.encoder(x, src_key_padding_mask=key_padding_mask)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("padding", [False, True])
def test_transformer_encoder_trains_and_evaluates_as_the_module(batch_first, norm_first, padding):
    torch.manual_seed(0)
    module = torch.jit.script(Encoder(batch_first, norm_first))
    fused, report = jit.fuse(module)
    # the feed-forward's linear + relu; MHA's dropout, in its own code and on the fused path, and two
    # LayerNorms per layer
    assert report.fused == ["2 x multi-head attention", "2 x linear + relu", "6 x dropout", "4 x layer_norm"], report
    x = sequences(3, LENGTH, batch_first, torch.float)
    key_padding_mask = masks("padding bool", 3, LENGTH, LENGTH, torch.float)[0] if padding else None
    parameters = list(module.parameters())
    for _ in range(2):
        got, fused_ran = ran_fused(lambda: fused(x, key_padding_mask))
        want = module(x, key_padding_mask)
        assert fused_ran
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        got_grads = torch.autograd.grad(got.square().sum(), [x, *parameters])
        want_grads = torch.autograd.grad(want.square().sum(), [x, *parameters])
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    module.eval(), fused.eval()
    with torch.no_grad():  # the module takes its native fast path, padded rows nested away
        want = module(x, key_padding_mask)
        got = fused(x, key_padding_mask)
        if padding:  # the fast path leaves a padded position's output 0, the slow path computes it
            keep = ~key_padding_mask if batch_first else ~key_padding_mask.t()
            got, want = got[keep], want[keep]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # where the module may fail (batch_first, padded)
            in_bf16 = fused(x, key_padding_mask)
    assert in_bf16.dtype == torch.float  # the last LayerNorm runs in float32 under autocast
    if padding:
        in_bf16 = in_bf16[keep]
    torch.testing.assert_close(in_bf16, want, atol=0.1, rtol=0.05)  # LayerNorm's outputs, of scale 1
