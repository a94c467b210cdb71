"""afterburner.nn.functional.attention against the unfused composition softmax(q k^T * scale + mask) v
in Python PyTorch (torch 2.x's scaled_dot_product_attention's math, which torch 1.13 lacks), in
double: values and gradients, gradcheck, fp32 and bf16, masks and causal, rows that see no key,
a second call, inputs unchanged, TorchScript, and nn.MultiheadAttention's forward rebuilt on it."""
import io
import math

import pytest
import torch
import torch.nn.functional as F

import afterburner  # noqa: F401  (loads the ops)
from afterburner.nn import functional as abf


def reference(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """torch 2.x's math: bool masks (True = attend) and the causal triangle become 0 / -inf, added."""
    q, k, v = q.double(), k.double(), v.double()
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, dtype=torch.double).masked_fill(~attn_mask, -math.inf)
        scores = scores + attn_mask.double()
    if is_causal:
        keep = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril()
        scores = scores + torch.zeros(keep.shape, dtype=torch.double).masked_fill(~keep, -math.inf)
    return torch.softmax(scores, -1) @ v


def draw(batch, heads, q_len, k_len, dim, mask, dtype=torch.double, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, length, dim, generator=generator).to(dtype).requires_grad_()
               for length in (q_len, k_len, k_len))
    if mask == "bool":
        attn_mask = torch.rand(batch, 1, q_len, k_len, generator=generator) < 0.85
    elif mask == "float":
        attn_mask = torch.randn(q_len, k_len, generator=generator).to(dtype)
    else:
        attn_mask = None
    return q, k, v, attn_mask


# (batch, heads, Lq, Lk, head dim): batch 1, one row, lengths across the kernel's 64-row query and
# 128-row key blocks, Lq != Lk both ways, head dims 8, 64 and 80.
SHAPES = [(1, 1, 1, 1, 8), (2, 3, 7, 7, 8), (1, 2, 129, 300, 64), (2, 1, 300, 129, 80), (1, 1, 7, 1, 64)]
MASKS = [None, "bool", "float"]


def same(a, b):
    """Equal values and NaN in the same places (torch.equal says NaN != NaN)."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


def grads_of(output, inputs, upstream):
    return torch.autograd.grad(output, inputs, upstream.to(output.dtype))


def libtorch_bf16(q, k, v, attn_mask, is_causal, upstream):
    """The output and gradients of the composition in LibTorch's bf16 ops (MultiheadAttention's core
    under autocast: bf16 matmuls, the softmax of bf16 scores), on the same bf16 values."""
    q, k, v = (t.detach().to(torch.bfloat16).requires_grad_() for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.size(-1)))
    if attn_mask is not None:
        scores = scores + (torch.zeros(attn_mask.shape).masked_fill(~attn_mask, -math.inf)
                           if attn_mask.dtype == torch.bool else attn_mask).to(torch.bfloat16)
    if is_causal:
        keep = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    out = torch.softmax(scores, -1) @ v
    return (out,) + grads_of(out, (q, k, v), upstream)


def assert_matches(shape, mask, is_causal, dtype, atol, rtol):
    """Ours in `dtype` against the composition in double on the same values (dtype's, upcast); in
    bf16 also within twice what LibTorch's own bf16 composition moves each figure, where that is more
    (where LibTorch's bf16 matmuls compute the scores, they are rounded to bf16 as there)."""
    q, k, v, attn_mask = draw(*shape, mask, dtype)
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected = reference(*exact, attn_mask, is_causal)
    upstream = torch.randn(expected.shape, dtype=torch.double)
    expected_grads = grads_of(expected, exact, upstream)
    moves = [0.0] * 4
    if dtype == torch.bfloat16:
        moves = [(got.double() - want).nan_to_num(0.0).abs().max().item() for got, want in
                 zip(libtorch_bf16(q, k, v, attn_mask, is_causal, upstream), (expected,) + expected_grads)]
    before = [t.detach().clone() for t in (q, k, v)]
    first = None
    for call in range(2):
        ours = abf.attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        assert ours.dtype == dtype
        grads = grads_of(ours, (q, k, v), upstream)
        for got, want, libtorch_moves in zip((ours,) + grads, (expected,) + expected_grads, moves):
            finite = want[want.isfinite()]
            largest = finite.abs().max().item() if finite.numel() else 1
            torch.testing.assert_close(got.double(), want, atol=max(atol * max(1, largest), 2 * libtorch_moves),
                                       rtol=rtol, equal_nan=True)
        if first is None:
            first = (ours, grads)
        else:  # a second call gives the same bits
            assert same(ours, first[0]) and all(same(a, b) for a, b in zip(grads, first[1]))
    for was, now in zip(before, (q, k, v)):
        assert torch.equal(was, now.detach()), "an input changed"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_the_unfused_composition_in_double(shape, mask, is_causal):
    assert_matches(shape, mask, is_causal, torch.double, 1e-12, 1e-12)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_float_and_bfloat16_match_the_double_composition(shape, mask, is_causal):
    assert_matches(shape, mask, is_causal, torch.float, 1e-5, 1e-5)
    # bf16 inputs, fp32 inside, the results rounded to bf16 once: within two bf16 ulps (2^-7); below
    # 1,024 x 1,024 scores LibTorch's bf16 matmuls compute them, within twice what LibTorch's own
    # bf16 composition moves.
    assert_matches(shape, mask, is_causal, torch.bfloat16, 2 ** -7, 2 ** -7)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_gradcheck(mask, is_causal):
    q, k, v, attn_mask = draw(2, 2, 5, 3, 4, mask)
    assert torch.autograd.gradcheck(lambda q, k, v: abf.attention(q, k, v, attn_mask, is_causal, 0.8), (q, k, v))
    assert torch.autograd.gradgradcheck(lambda q, k, v: abf.attention(q, k, v, attn_mask, is_causal), (q, k, v))


def test_a_row_that_sees_no_key_is_nan_as_softmax_makes_it():
    q, k, v, _ = draw(1, 2, 6, 9, 8, None)
    keep = torch.ones(6, 9, dtype=torch.bool)
    keep[4] = False
    ours, expected = abf.attention(q, k, v, keep), reference(q, k, v, keep)
    assert ours[:, :, 4].isnan().all() and ours[:, :, :4].isfinite().all()
    torch.testing.assert_close(ours, expected, equal_nan=True)
    for got, want in zip(torch.autograd.grad(ours.sum(), (q, k, v)), torch.autograd.grad(expected.sum(), (q, k, v))):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_without_grad_and_in_inference_mode():
    q, k, v, mask = (t.detach() if t is not None else None for t in draw(2, 2, 70, 130, 16, "bool"))
    expected = reference(q, k, v, mask, True)
    with torch.no_grad():
        torch.testing.assert_close(abf.attention(q, k, v, mask, True), expected, atol=1e-12, rtol=1e-12,
                                   equal_nan=True)
    with torch.inference_mode():  # below autograd: the CPU kernel
        torch.testing.assert_close(abf.attention(q.clone(), k.clone(), v.clone(), mask, True), expected,
                                   atol=1e-12, rtol=1e-12, equal_nan=True)


def loaded(module):
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


class Attend(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return abf.attention(q, k, v, attn_mask=mask, is_causal=True, scale=0.3)


@pytest.mark.parametrize("compile", ["script", "trace"])
def test_inside_torchscript_and_a_saved_file(compile):
    q, k, v, mask = draw(2, 2, 9, 9, 8, "bool", torch.float)
    model = Attend()
    compiled = torch.jit.script(model) if compile == "script" else torch.jit.trace(model, (q, k, v, mask))
    assert "afterburner::attention" in str(compiled.inlined_graph)
    expected = reference(q, k, v, mask, True, 0.3)
    expected_grads = torch.autograd.grad(expected.sum(), (q, k, v))
    for module in (compiled, loaded(compiled)):
        ours = module(q, k, v, mask)
        torch.testing.assert_close(ours.double(), expected, atol=1e-5, rtol=1e-5, equal_nan=True)
        for got, want in zip(torch.autograd.grad(ours.sum(), (q, k, v)), expected_grads):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, equal_nan=True)


def test_bf16_autocast_runs_in_bf16():
    q, k, v, _ = draw(2, 2, 33, 70, 16, None, torch.float)
    with torch.autocast("cpu", torch.bfloat16):
        ours = abf.attention(q, k, v, is_causal=True)
    assert ours.dtype == torch.bfloat16
    assert torch.equal(ours, abf.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True))
    assert all(g.dtype == torch.float for g in torch.autograd.grad(ours.float().sum(), (q, k, v)))


def test_multihead_attention_forward_rebuilt_on_it():
    """nn.MultiheadAttention (batch_first, key padding) = its projections around attention: the
    mapping the graph rewrite will make."""
    torch.manual_seed(1)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).double()
    x = torch.randn(3, 11, 32, dtype=torch.double, requires_grad=True)
    padding = torch.zeros(3, 11, dtype=torch.bool)
    padding[1, 8:] = True  # MultiheadAttention's key_padding_mask: True = ignore
    expected, _ = mha(x, x, x, key_padding_mask=padding, need_weights=False)

    def heads(t):
        return t.view(3, 11, 4, 8).transpose(1, 2)

    q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1)
    out = abf.attention(heads(q), heads(k), heads(v), attn_mask=~padding[:, None, None, :])
    ours = mha.out_proj(out.transpose(1, 2).reshape(3, 11, 32))
    torch.testing.assert_close(ours, expected, atol=1e-12, rtol=1e-12)
    params = [x, mha.in_proj_weight, mha.out_proj.weight]
    for got, want in zip(torch.autograd.grad(ours.sum(), params), torch.autograd.grad(expected.sum(), params)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("call, named", [
    (lambda q, k, v: abf.attention(q, k[..., :3], v), "attention key"),
    (lambda q, k, v: abf.attention(q, k, v[:, :, :2]), "attention value"),
    (lambda q, k, v: abf.attention(q, k, v, torch.ones(5, 2, dtype=torch.bool)), "attention attn_mask"),
    (lambda q, k, v: abf.attention(q, k.double(), v), "one dtype"),
])
def test_bad_arguments_are_one_clear_error(call, named):
    q, k, v, _ = draw(1, 2, 5, 4, 8, None, torch.float)
    with pytest.raises(RuntimeError, match=named):
        call(q.detach(), k.detach(), v.detach())
