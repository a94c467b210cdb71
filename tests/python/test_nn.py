"""afterburner.nn against torch.nn and Panther's definitions of SKLinear and SKConv2d: values and gradients
against double-precision references, state_dicts, TorchScript, and fuse() on models written the
way users write them."""
import copy
import io

import pytest
import torch
import torch.nn.functional as F

import afterburner.jit
from afterburner import nn as abnn


def sketched_reference(x, S1s, S2s, U1s, U2s, bias):
    """Panther's SKLinear forward, term by term, in double."""
    x, S1s, S2s, U1s, U2s = (t.double() for t in (x, S1s, S2s, U1s, U2s))
    terms = S1s.shape[0]
    y = sum((x @ S1s[i]) @ U1s[i] + (x @ U2s[i]) @ S2s[i] for i in range(terms)) / (2 * terms)
    return y if bias is None else y + bias.double()


def round_trip(module):
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


# Panther's own test shapes (tests/test_sklinear_cpp.py: batch 32, 1024 -> 2048, rank 64, 3 terms)
# and odd small ones, with and without bias, 1-D to 3-D inputs.
@pytest.mark.parametrize("in_features,out_features,terms,rank,bias,batch_shape", [
    (1024, 2048, 3, 64, True, (32,)),
    (37, 29, 2, 3, True, (1,)),
    (37, 29, 1, 5, False, (4, 3)),
    (64, 48, 2, 4, True, ()),
])
def test_sklinear_matches_panthers_definition(in_features, out_features, terms, rank, bias, batch_shape):
    layer = abnn.SKLinear(in_features, out_features, num_terms=terms, low_rank=rank, bias=bias)
    assert layer.S1s.shape == (terms, in_features, rank) and layer.S2s.shape == (terms, rank, out_features)
    assert layer.U1s.shape == (terms, rank, out_features) and layer.U2s.shape == (terms, in_features, rank)
    expected_keys = {"S1s", "S2s", "U1s", "U2s"} | ({"bias"} if bias else set())
    assert set(layer.state_dict()) == expected_keys
    assert {name for name, _ in layer.named_parameters()} == expected_keys - {"U1s", "U2s"}
    x = torch.randn(*batch_shape, in_features, requires_grad=True)
    params = [x] + list(layer.parameters())
    expected = sketched_reference(x, layer.S1s, layer.S2s, layer.U1s, layer.U2s, layer.bias)
    grad_out = torch.randn(expected.shape, dtype=torch.double)
    expected_grads = torch.autograd.grad(expected, params, grad_out)
    for _ in range(2):
        y = layer(x)
        assert y.shape == (*batch_shape, out_features) and y.dtype == torch.float32
        torch.testing.assert_close(y.double(), expected, rtol=1e-4, atol=1e-4)
        for got, want in zip(torch.autograd.grad(y, params, grad_out.float()), expected_grads):
            torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=1e-3)
    assert layer.U1s.grad is None and not layer.U1s.requires_grad


def test_sklinear_starts_from_W_init_as_panther_does():
    W = torch.randn(24, 40)  # torch.nn.Linear's layout [out, in]
    layer = abnn.SKLinear(40, 24, num_terms=2, low_rank=3, W_init=W)
    for i in range(2):
        torch.testing.assert_close(layer.S1s[i], W.T @ layer.U1s[i].T)
        torch.testing.assert_close(layer.S2s[i], layer.U2s[i].T @ W.T)
    with pytest.raises(RuntimeError, match="dense_weight"):
        abnn.SKLinear(40, 24, num_terms=2, low_rank=3, W_init=W.T)


def test_sklinear_loads_a_panther_state_dict_and_runs_in_torchscript():
    source = abnn.SKLinear(50, 30, num_terms=2, low_rank=4)
    # What panther.nn.SKLinear saves: the same names and shapes, other values.
    panther_state = {name: torch.randn_like(t) for name, t in source.state_dict().items()}
    layer = abnn.SKLinear(50, 30, num_terms=2, low_rank=4)
    layer.load_state_dict(panther_state)
    x = torch.randn(7, 50)
    expected = sketched_reference(x, *(panther_state[n] for n in ("S1s", "S2s", "U1s", "U2s", "bias")))
    model = torch.nn.Sequential(layer, torch.nn.ReLU())
    for module in (model, torch.jit.script(model), round_trip(torch.jit.script(model))):
        torch.testing.assert_close(module(x).double(), F.relu(expected), rtol=1e-4, atol=1e-4)


def test_sklinear_inference_reuses_its_operands_only_while_its_tensors_are_unchanged():
    torch.manual_seed(3)
    layer = abnn.SKLinear(96, 40, num_terms=2, low_rank=5)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.05)
    x = torch.randn(7, 96)

    def expect_current():
        for _ in range(2):  # the second call from the kept operands
            expected = sketched_reference(x, layer.S1s, layer.S2s, layer.U1s, layer.U2s, layer.bias)
            torch.testing.assert_close(layer(x).double(), expected.detach(), rtol=1e-4, atol=1e-4)

    for step in range(2):  # training steps between evaluations, as a training loop interleaves them
        with torch.no_grad():
            expect_current()
        optimizer.zero_grad()
        layer(x).square().sum().backward()
        optimizer.step()
        assert layer.S1s.grad is not None and layer.S1s.grad.abs().sum() > 0
    with torch.inference_mode():
        expect_current()
    with torch.no_grad():
        layer.load_state_dict({name: torch.randn_like(t) for name, t in layer.state_dict().items()})
        expect_current()
        layer.U2s.neg_()
        expect_current()
        layer.S2s = torch.nn.Parameter(torch.randn_like(layer.S2s))
        expect_current()
        clone = copy.deepcopy(layer)
        clone.S1s.zero_()
        torch.testing.assert_close(clone(x).double(), sketched_reference(x, clone.S1s, clone.S2s, clone.U1s,
                                                                         clone.U2s, clone.bias), rtol=1e-4, atol=1e-4)
        expect_current()


def test_sklinear_rejects_bad_shapes_in_one_line():
    layer = abnn.SKLinear(20, 10, num_terms=1, low_rank=2)
    with pytest.raises(RuntimeError, match=r"SKLinear input: expected \[\.\.\., 20\]"):
        layer(torch.randn(3, 21))
    with pytest.raises(RuntimeError, match="SKLinear terms: must be at least 1"):
        abnn.SKLinear(20, 10, num_terms=0, low_rank=2)


def skconv2d_reference(x, S1s, U1s, bias, stride, padding):
    """Panther's SKConv2d forward as its tests state it, in double: term i is a convolution with
    the kernel sum_kappa U1s[i, kappa, o] S1s[i k + kappa]; the layer is the mean of the 2L terms."""
    terms, rank, _ = U1s.shape
    S = S1s.double().reshape(terms, rank, *S1s.shape[1:])
    kernels = torch.einsum("ikchw,iko->iochw", S, U1s.double())
    y = sum(F.conv2d(x.double(), kernels[i], None, stride, padding) for i in range(terms)) / terms
    return y if bias is None else y + bias.double().view(1, -1, 1, 1)


# Panther's own test shapes (tests/test_skconv2d.py), then a larger batch in channels_last
# without bias. (batch, in, out, height, width, kernel, stride, padding, rank, terms)
SKCONV2D_SHAPES = [
    (1, 1, 4, 10, 10, (3, 3), (1, 1), (1, 1), 2, 3, True, torch.contiguous_format),
    (2, 3, 8, 20, 20, (5, 5), (2, 2), (2, 2), 4, 5, True, torch.contiguous_format),
    (1, 1, 8, 10, 20, (3, 3), (1, 1), (1, 1), 2, 5, True, torch.contiguous_format),
    (2, 3, 4, 20, 10, (5, 5), (2, 2), (1, 1), 4, 3, True, torch.contiguous_format),
    (1, 3, 4, 10, 10, (3, 3), (1, 1), (2, 2), 2, 3, True, torch.contiguous_format),
    (64, 16, 32, 9, 11, (3, 2), (1, 2), (1, 0), 4, 1, False, torch.channels_last),
]


@pytest.mark.parametrize("batch,in_ch,out_ch,height,width,kernel,stride,padding,rank,terms,bias,memory_format",
                         SKCONV2D_SHAPES)
def test_skconv2d_matches_panthers_definition(batch, in_ch, out_ch, height, width, kernel, stride, padding, rank,
                                              terms, bias, memory_format):
    layer = abnn.SKConv2d(in_ch, out_ch, kernel, stride, padding, bias=bias, num_terms=terms, low_rank=rank)
    assert layer.S1s.shape == (2 * terms * rank, in_ch, *kernel) and layer.U1s.shape == (2 * terms, rank, out_ch)
    expected_keys = {"S1s", "U1s"} | ({"bias"} if bias else set())
    assert set(layer.state_dict()) == expected_keys
    assert {name for name, _ in layer.named_parameters()} == expected_keys - {"U1s"}
    x = torch.randn(batch, in_ch, height, width).to(memory_format=memory_format).requires_grad_()
    x_before = x.detach().clone()
    state_before = {name: t.clone() for name, t in layer.state_dict().items()}
    params = [x] + list(layer.parameters())
    expected = skconv2d_reference(x, layer.S1s, layer.U1s, layer.bias, stride, padding)
    grad_out = torch.randn(expected.shape, dtype=torch.double)
    expected_grads = torch.autograd.grad(expected, params, grad_out)
    for _ in range(2):
        y = layer(x)
        assert y.shape == expected.shape and y.dtype == torch.float32
        torch.testing.assert_close(y.double(), expected, rtol=1e-4, atol=1e-4)
        for got, want in zip(torch.autograd.grad(y, params, grad_out.float()), expected_grads):
            torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=1e-3)
    assert torch.equal(x.detach(), x_before) and not layer.U1s.requires_grad
    for name, tensor in layer.state_dict().items():  # forward and backward leave the layer's tensors as they were
        assert torch.equal(tensor, state_before[name]), name


def test_skconv2d_gradients_pass_gradcheck_in_double():
    x = torch.randn(2, 3, 7, 6, dtype=torch.double, requires_grad=True)
    S1s = torch.randn(12, 3, 3, 2, dtype=torch.double, requires_grad=True)
    U1s = torch.randn(4, 3, 5, dtype=torch.double)
    bias = torch.randn(5, dtype=torch.double, requires_grad=True)
    op = torch.ops.afterburner.skconv2d
    assert torch.autograd.gradcheck(lambda x, S1s, bias: op(x, S1s, U1s, bias, [2, 1], [1, 0]), (x, S1s, bias))


def test_skconv2d_from_a_conv2d_builds_S1s_as_panther_does():
    conv = torch.nn.Conv2d(3, 16, 5, stride=2, padding="valid")
    layer = abnn.SKConv2d.fromTorch(conv, num_terms=2, low_rank=3)
    assert (layer.stride, layer.padding, layer.kernel_size) == ((2, 2), (0, 0), (5, 5))
    # panther.nn.SKConv2d(layer=conv): kernels [in, Kh, Kw, out], S1s from their mode-4 unfolding.
    kernels = conv.weight.detach().permute(1, 2, 3, 0)
    panther_S1s = torch.stack([(kernels @ layer.U1s[i].T).reshape(-1, 3) for i in range(4)])
    panther_S1s = panther_S1s.permute(0, 2, 1).reshape(12, 3, 5, 5)
    torch.testing.assert_close(layer.S1s.detach(), panther_S1s)
    assert torch.equal(layer.bias, conv.bias) and layer.bias is not conv.bias
    assert abnn.SKConv2d(3, 8, 3, padding="same").padding == (1, 1)
    for bad, message in [(dict(layer=torch.nn.Conv2d(4, 8, 3, groups=2)), "SKConv2d layer: groups 2"),
                         (dict(layer=torch.nn.Conv2d(4, 8, 3, dilation=2)), r"SKConv2d layer: dilation \(2, 2\)"),
                         (dict(kernel_size=4, padding="same"), "'same' needs odd kernel sizes"),
                         (dict(padding="full"), "expected 'same', 'valid' or numbers")]:
        with pytest.raises(ValueError, match=message):
            abnn.SKConv2d(4, 8, **bad)


def test_skconv2d_loads_a_panther_state_dict_and_runs_in_torchscript():
    source = abnn.SKConv2d(3, 24, num_terms=2, low_rank=4)
    # What panther.nn.SKConv2d saves: the same names and shapes, other values.
    panther_state = {name: torch.randn_like(t) for name, t in source.state_dict().items()}
    layer = abnn.SKConv2d(3, 24, num_terms=2, low_rank=4)
    layer.load_state_dict(panther_state)
    x = torch.randn(5, 3, 8, 7)
    expected = skconv2d_reference(x, panther_state["S1s"], panther_state["U1s"], panther_state["bias"], 1, 1)
    model = torch.nn.Sequential(layer, torch.nn.ReLU())
    for module in (model, torch.jit.script(model), round_trip(torch.jit.script(model))):
        for _ in range(2):
            torch.testing.assert_close(module(x).double(), F.relu(expected), rtol=1e-4, atol=1e-4)


def test_skconv2d_rejects_bad_shapes_in_one_line():
    layer = abnn.SKConv2d(4, 8, num_terms=1, low_rank=2)
    with pytest.raises(RuntimeError, match=r"SKConv2d input: expected \[N, 4, H, W\]"):
        layer(torch.randn(2, 5, 6, 6))
    with pytest.raises(RuntimeError, match="SKConv2d U1s: expected"):
        torch.ops.afterburner.skconv2d(torch.randn(2, 4, 6, 6), layer.S1s, torch.randn(3, 2, 8))
    with pytest.raises(RuntimeError, match="SKConv2d rank: must be at least 1"):
        abnn.SKConv2d(4, 8, num_terms=1, low_rank=0)


def test_fused_layers_start_as_torch_nn_layers_do():
    torch.manual_seed(3)
    linear, conv = torch.nn.Linear(9, 4), torch.nn.Conv2d(3, 5, 3, padding=1, bias=False)
    torch.manual_seed(3)
    fused_linear, fused_conv = abnn.LinearReLU(9, 4), abnn.Conv2dReLU(3, 5, 3, padding=1, bias=False)
    assert torch.equal(linear.weight, fused_linear.weight) and torch.equal(linear.bias, fused_linear.bias)
    assert torch.equal(conv.weight, fused_conv.weight) and fused_conv.bias is None
    x = torch.randn(2, 3, 6, 6)
    torch.testing.assert_close(fused_conv(x), F.relu(conv(x)))
    with pytest.raises(ValueError, match="padding_mode 'reflect'"):
        abnn.Conv2dReLU(3, 5, 3, padding=1, padding_mode="reflect")


class UserNet(torch.nn.Module):
    """Written as users write models: a custom forward over named Sequentials, BatchNorm,
    Dropout, a nested Sequential, a no-bias layer and a tuple output."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(inplace=True), torch.nn.MaxPool2d(2, 2),
            torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1, bias=False), torch.nn.ReLU()))
        self.classifier = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(16 * 7 * 7, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3),
            torch.nn.Linear(32, 10))

    def forward(self, x):
        features = self.features(x)
        return self.classifier(features), features.mean()


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_fuse_keeps_a_users_model_exact(batch):
    model = UserNet()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # built before fusing: must still train it
    report = abnn.fuse(model)
    assert report.fused == ["features.2-3: ReLU + MaxPool2d",
                            "features.5-6: ReLU + MaxPool2d",
                            "features.7.0-1: Conv2d + ReLU",
                            "classifier.1-2: Linear + ReLU"]
    assert report.notices == []
    assert list(model.state_dict()) == list(reference.state_dict())
    assert isinstance(model.classifier[1], abnn.LinearReLU) and isinstance(model.features[3], abnn.ReluMaxPool2d)
    x, target = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    for step in range(2):  # a training step each, then the next step starts from equal weights
        logits, losses = [], []
        for net in (model, reference):
            torch.manual_seed(step)  # the same Dropout masks
            net_logits, mean = net(x)
            logits.append(net_logits)
            losses.append(F.cross_entropy(net_logits, target) + mean)
        torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)
        for loss in losses:
            loss.backward()
        for (name, got), want in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5, msg=name)
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            for got, want in zip(model.parameters(), reference.parameters()):
                want.copy_(got)
        reference.zero_grad()
    model.eval()
    reference.eval()
    x = torch.randn(batch, 1, 28, 28)
    for module in (torch.jit.script(model), round_trip(torch.jit.trace(model, x))):
        for _ in range(2):
            torch.testing.assert_close(module(x), reference(x), rtol=1e-5, atol=1e-5)


def test_fuse_says_what_it_leaves_unfused():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1, padding_mode="reflect"), torch.nn.ReLU(),
        torch.nn.ReLU(), torch.nn.MaxPool2d(2, return_indices=True),
        torch.nn.Linear(4, 4), torch.nn.Tanh())
    report = abnn.fuse(model)
    assert report.fused == []
    assert report.notices == ["0-1: Conv2d + ReLU left unfused: padding_mode 'reflect' (only zeros)",
                              "2-3: ReLU + MaxPool2d left unfused: return_indices=True"]
    assert type(model[0]) is torch.nn.Conv2d and type(model[3]) is torch.nn.MaxPool2d


def same_bits(a, b):
    return a.dtype == b.dtype and torch.equal(a.isnan(), b.isnan()) and \
        torch.equal(a.nan_to_num(0.0).view(torch.int32 if a.dtype == torch.float32 else torch.int16),
                    b.nan_to_num(0.0).view(torch.int32 if b.dtype == torch.float32 else torch.int16))


class SketchedMLP(torch.nn.Module):
    """A user's sketched MLP: SKLinear, ReLU and Dropout in a Sequential, a custom forward around it."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Flatten(), abnn.SKLinear(784, 200, num_terms=1, low_rank=16),
                                        torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                        abnn.SKLinear(200, 100, num_terms=2, low_rank=8), torch.nn.Dropout(0.1),
                                        abnn.SKLinear(100, 64, num_terms=1, low_rank=4, bias=False), torch.nn.ReLU())
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.body(x))


@pytest.mark.parametrize("batch", [1, 7, 256])
def test_sklinear_relu_and_dropout_options_equal_torch_layers_after_it(batch):
    torch.manual_seed(0)
    plain = abnn.SKLinear(96, 50, num_terms=2, low_rank=6)
    fused = copy.deepcopy(plain)
    fused.relu, fused.dropout = True, 0.3
    assert "relu=True, dropout=0.3" in repr(fused)
    x = torch.randn(batch, 3, 96)
    x[0, 0, 4] = float("nan")
    for module in (fused, torch.jit.script(fused)):
        for training in (True, False, True):  # twice in training: other masks, still equal
            module.train(training)
            plain.train(training)
            torch.manual_seed(training + 10)
            ours = module(x)
            torch.manual_seed(training + 10)
            theirs = F.dropout(F.relu(plain(x)), 0.3, training)
            assert same_bits(ours, theirs)
    with pytest.raises(ValueError, match="SKLinear dropout: must be between 0 and 1, got 1.5"):
        abnn.SKLinear(96, 50, num_terms=2, low_rank=6, dropout=1.5)


@pytest.mark.parametrize("autocast", [False, True])
def test_fuse_and_jit_fuse_put_relu_and_dropout_into_sklinear(autocast):
    torch.manual_seed(1)
    reference = SketchedMLP()
    model = copy.deepcopy(reference)
    report = abnn.fuse(model)
    assert report.fused == ["body.1-3: SKLinear + ReLU + Dropout", "body.4-5: SKLinear + Dropout",
                            "body.6-7: SKLinear + ReLU"]
    assert list(model.state_dict()) == list(reference.state_dict())
    assert model.body[1].relu and model.body[1].dropout == 0.3 and model.body[4].dropout == 0.1
    scripted, jit_report = afterburner.jit.fuse(torch.jit.script(copy.deepcopy(reference)))
    assert "3 x sketched linear + relu/dropout" in jit_report.fused
    x = torch.randn(33, 1, 28, 28)
    outputs, grads = [], []
    for net in (reference, model, scripted):
        torch.manual_seed(2)
        with torch.autocast("cpu", enabled=autocast):
            y = net(x)
        y.float().square().sum().backward()
        outputs.append(y)
        grads.append([p.grad.clone() for p in net.parameters()])
        net.zero_grad()
    assert same_bits(outputs[1], outputs[0]) and same_bits(outputs[2], outputs[0])
    for fused_grads in grads[1:]:
        for got, want in zip(fused_grads, grads[0]):
            assert same_bits(got, want)


class UpdatesItsInputInBetween(torch.nn.Module):
    """A forward that writes the sketched layer's input in place between the layer and its dropout."""

    def __init__(self):
        super().__init__()
        self.fc = abnn.SKLinear(30, 20, num_terms=1, low_rank=4)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        x = x.clone()
        y = torch.relu(self.fc(x))
        x.add_(1.0)
        return self.drop(y) + x.sum()


def test_jit_fuse_keeps_the_order_of_a_write_between_the_layer_and_its_dropout():
    torch.manual_seed(3)
    model = UpdatesItsInputInBetween()
    fused, report = afterburner.jit.fuse(torch.jit.script(model))
    assert "1 x sketched linear + relu/dropout" in report.fused
    assert "afterburner::dropout" not in str(fused.graph)  # the dropout moved up to the layer, not the layer down
    x = torch.randn(6, 30)
    for _ in range(2):
        torch.manual_seed(4)
        expected = model(x)
        torch.manual_seed(4)
        assert same_bits(fused(x), expected)
