"""afterburner.nn.RandMultiHeadAttention and make_performer against Panther's definition written
out in double, against torch.nn.MultiheadAttention as the features grow, scripted and traced,
state_dicts, and the global generator left alone."""
import io
import math

import pytest
import torch
import torch.nn.functional as F

from afterburner import nn as abnn


def panther_features(x, projection, softmax, is_query):
    m = projection.shape[0]
    if not softmax:
        return F.relu(x @ projection.T / math.sqrt(m)) + 1e-5
    scaled = x * x.shape[-1] ** -0.25
    dash = scaled @ projection.T
    diag = (scaled ** 2).sum(-1, keepdim=True) / 2
    stabilizer = dash.max(-1, keepdim=True).values
    if not is_query:
        stabilizer = stabilizer.max(-3, keepdim=True).values
    return (torch.exp(dash - diag - stabilizer) + 1e-5) / math.sqrt(m)


def panther_forward(layer, query, key, value):
    """Panther's rmha_forward in double: projections, features, then the non-causal products or the
    causal running sums position by position."""
    d = lambda t: None if t is None else t.double()  # noqa: E731
    b, length, e = query.shape
    h = layer.num_heads

    def heads(x, w, bias):
        return F.linear(x.double(), d(w), d(bias)).view(x.shape[0], x.shape[1], h, e // h)

    p = layer.projection_matrix.double()
    softmax = layer.kernel_fn == "softmax"
    qf = panther_features(heads(query, layer.Wq, layer.bq), p, softmax, True)
    kf = panther_features(heads(key, layer.Wk, layer.bk), p, softmax, False)
    v = heads(value, layer.Wv, layer.bv)
    if not layer.causal:
        numerator = torch.einsum("blhm,bshm,bshd->blhd", qf, kf, v)
        normaliser = torch.einsum("blhm,bshm->blh", qf, kf)
    else:
        sums = torch.zeros(b, h, qf.shape[-1], v.shape[-1], dtype=torch.double)
        key_sums = torch.zeros(b, h, qf.shape[-1], dtype=torch.double)
        rows, norms = [], []
        for i in range(length):
            sums = sums + torch.einsum("bhm,bhd->bhmd", kf[:, i], v[:, i])
            key_sums = key_sums + kf[:, i]
            rows.append(torch.einsum("bhmd,bhm->bhd", sums, qf[:, i]))
            norms.append((qf[:, i] * key_sums).sum(-1))
        numerator, normaliser = torch.stack(rows, 1), torch.stack(norms, 1)
    attended = (numerator / normaliser.unsqueeze(-1)).reshape(b, length, e)
    return F.linear(attended, d(layer.W0), d(layer.b0))


def round_trip(module):
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


def test_parameters_and_buffer_carry_panthers_names_and_shapes():
    layer = abnn.RandMultiHeadAttention(64, 4, 32)
    assert [n for n, _ in layer.named_parameters()] == ["Wq", "Wk", "Wv", "W0", "bq", "bk", "bv", "b0"]
    assert list(layer.state_dict()) == ["Wq", "Wk", "Wv", "W0", "bq", "bk", "bv", "b0", "projection_matrix"]
    assert layer.projection_matrix.shape == (32, 16) and not layer.projection_matrix.requires_grad
    assert all(torch.count_nonzero(b) == 0 for b in (layer.bq, layer.bk, layer.bv, layer.b0))
    no_bias = abnn.RandMultiHeadAttention(64, 4, 32, bias=False)
    assert no_bias.bq is None and list(no_bias.state_dict()) == ["Wq", "Wk", "Wv", "W0", "projection_matrix"]


@pytest.mark.parametrize("kernel_fn", ["softmax", "relu"])
@pytest.mark.parametrize("iscausal", [False, True])
@pytest.mark.parametrize("batch,length,embed,heads,features", [(1, 1, 8, 2, 4), (2, 7, 12, 3, 5), (3, 131, 16, 2, 20)])
def test_forward_and_gradients_equal_panthers_definition_in_double(kernel_fn, iscausal, batch, length, embed, heads,
                                                                   features):
    torch.manual_seed(0)
    layer = abnn.RandMultiHeadAttention(embed, heads, features, kernel_fn=kernel_fn, iscausal=iscausal,
                                        dtype=torch.double)
    with torch.no_grad():
        for bias in (layer.bq, layer.bk, layer.bv, layer.b0):
            bias.normal_(0, 0.1)
    x = torch.randn(batch, length, embed, dtype=torch.double, requires_grad=True)
    out, weights = layer(x, x, x)
    assert weights is None
    assert torch.equal(out, layer(x, x, x)[0]), "a second call"
    upstream = torch.randn_like(out)
    trained = [x] + list(layer.parameters())
    grads = torch.autograd.grad(out, trained, upstream)
    expected = panther_forward(layer, x, x, x)
    expected_grads = torch.autograd.grad(expected, trained, upstream)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    for name, got, want in zip(["x"] + [n for n, _ in layer.named_parameters()], grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=name)


def relative_error(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("bias", [True, False])
def test_make_performer_estimates_multihead_attention_better_as_features_grow(bias):
    torch.manual_seed(1)
    mha = torch.nn.MultiheadAttention(32, 2, bias=bias, batch_first=True).double().eval()
    x = torch.randn(2, 48, 32, dtype=torch.double) * 0.5
    exact, _ = mha(x, x, x, need_weights=False)
    errors = []
    for m in (8, 64, 512):
        draws = [relative_error(abnn.make_performer(mha, m, "softmax", False, seed=s).eval()(x, x, x)[0], exact)
                 for s in range(8)]
        errors.append(sum(draws) / len(draws))
    assert errors[0] > errors[1] > errors[2], errors
    slope = math.log(errors[2] / errors[0]) / math.log(64)
    assert -0.65 < slope < -0.35, errors
    performer = abnn.make_performer(mha, 16, "relu", True)
    assert torch.equal(performer.Wk, mha.in_proj_weight[32:64]) and torch.equal(performer.W0, mha.out_proj.weight)
    assert (performer.b0 is None) == (not bias) and performer.kernel_fn == "relu" and performer.causal
    assert performer.Wq.data_ptr() != mha.in_proj_weight.data_ptr(), "copies, not views of the MHA's weights"


def test_make_performer_refuses_what_it_cannot_carry():
    with pytest.raises(ValueError, match="kdim"):
        abnn.make_performer(torch.nn.MultiheadAttention(16, 2, kdim=8, vdim=8), 8)
    with pytest.raises(ValueError, match="MultiheadAttention"):
        abnn.make_performer(torch.nn.Linear(4, 4), 8)


def test_scripted_traced_and_saved_answer_as_eager_twice():
    torch.manual_seed(2)

    class Block(torch.nn.Module):  # the way a user puts attention into a model
        def __init__(self):
            super().__init__()
            self.attention = abnn.RandMultiHeadAttention(24, 3, 16, dropout=0.1, iscausal=True)
            self.norm = torch.nn.LayerNorm(24)

        def forward(self, x):
            attended, _ = self.attention(x, x, x)
            return self.norm(x + attended)

    block = Block().eval()
    x = torch.randn(3, 10, 24)
    expected = block(x)
    for module in (torch.jit.script(block), torch.jit.trace(block, x), round_trip(torch.jit.script(block))):
        assert torch.equal(module(x), expected) and torch.equal(module(x), expected)
    copy = Block()
    copy.load_state_dict(block.state_dict())
    assert torch.equal(copy.eval()(x), expected)


def test_dropout_is_drawn_in_training_only():
    torch.manual_seed(3)
    layer = abnn.RandMultiHeadAttention(16, 2, 16, dropout=0.5)
    x = torch.randn(2, 9, 16)
    layer.eval()
    assert torch.equal(layer(x, x, x)[0], layer(x, x, x)[0])
    undropped = layer(x, x, x)[0]
    layer.train()
    assert not torch.allclose(layer(x, x, x)[0], undropped)


def test_construction_leaves_torchs_generator_alone_and_seeds_repeat():
    # Panther reseeds torch's generator with 42 while drawing the projection: whatever seed the
    # user set, every draw after building a layer was the same. Here the user's seed still rules.
    after = []
    for user_seed in (4, 99):
        torch.manual_seed(user_seed)
        abnn.RandMultiHeadAttention(16, 2, 8, seed=5)
        after.append(torch.rand(4))
    assert not torch.equal(after[0], after[1])
    torch.manual_seed(4)
    first = abnn.RandMultiHeadAttention(16, 2, 8)
    torch.manual_seed(4)
    again = abnn.RandMultiHeadAttention(16, 2, 8)
    assert first.seed == again.seed and torch.equal(first.projection_matrix, again.projection_matrix)
    assert torch.equal(first.Wq, again.Wq)
    assert not torch.equal(first.projection_matrix, abnn.RandMultiHeadAttention(16, 2, 8).projection_matrix)
    assert torch.equal(abnn.RandMultiHeadAttention(16, 2, 8, seed=5).projection_matrix,
                       abnn.RandMultiHeadAttention(16, 2, 8, seed=5).projection_matrix)


def test_bad_arguments_are_one_clear_error():
    with pytest.raises(ValueError, match="num_heads"):
        abnn.RandMultiHeadAttention(10, 3, 8)
    with pytest.raises(ValueError, match="dropout"):
        abnn.RandMultiHeadAttention(8, 2, 8, dropout=1.0)
    with pytest.raises(ValueError, match="kernel_fn"):
        abnn.RandMultiHeadAttention(8, 2, 8, kernel_fn="gelu")
    layer = abnn.RandMultiHeadAttention(8, 2, 4)
    with pytest.raises(RuntimeError, match="query"):
        layer(torch.randn(5, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8))
    mask = torch.ones(2, 5, 5, dtype=torch.bool)
    mask[0, 0, 0] = False
    x = torch.randn(2, 5, 8)
    with pytest.raises(RuntimeError, match="attention_mask"):
        layer(x, x, x, mask)
