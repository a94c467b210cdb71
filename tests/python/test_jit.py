"""afterburner.jit.fuse on models written the way users write them (a custom forward with
functional calls, BatchNorm, Dropout, an in-place relu, a no-bias layer, a tuple output), scripted
and traced: the copy computes and trains as the module does, shares its parameters, leaves it
unchanged, and saves to a file that loads."""
import io

import pytest
import torch
import torch.nn.functional as F

from afterburner import jit, nn


class UserNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.conv3 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16 * 7 * 7, 32)
        self.dropout = torch.nn.Dropout(0.3)
        self.out = torch.nn.Linear(32, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv1(x))), 2)
        x = torch.relu(self.conv2(x))
        x = F.max_pool2d(F.relu(self.conv3(x), inplace=True), kernel_size=2, stride=2)
        features = F.relu(self.fc(torch.flatten(x, 1)))
        return self.out(self.dropout(features)), features.mean()


def compiled(kind, model):
    if kind == "script":
        return torch.jit.script(model)
    return torch.jit.trace(model, torch.randn(2, 1, 28, 28), check_trace=False)  # Dropout differs call to call


def assert_trains_as(fused, x, autocast, want, want_grads, output_bound, gradient_bound):
    """fused(x) under `autocast` and its parameters' gradients of sum(output^2), called twice: within
    the bounds (times the largest magnitude) of `want` and of each of `want_grads`, and the same
    bits the second time."""
    first = None
    for _ in range(2):
        with autocast:
            got = fused(x)
        got_grads = torch.autograd.grad(got.float().square().sum(), list(fused.parameters()))
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=output_bound * want.abs().max().item())
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, rtol=0, atol=gradient_bound * w.abs().max().item())
        if first is not None:
            assert torch.equal(got, first[0]) and all(torch.equal(a, b) for a, b in zip(got_grads, first[1]))
        first = (got, got_grads)


@pytest.mark.parametrize("kind", ["script", "trace"])
@pytest.mark.parametrize("batch", [1, 3, 64])
def test_fused_copy_computes_and_trains_as_the_module(kind, batch):
    torch.manual_seed(0)
    module = compiled(kind, UserNet())
    code_before = module.code
    fused, report = jit.fuse(module)
    assert report.fused == ["2 x relu + max_pool2d", "1 x conv2d + relu", "1 x linear + relu", "2 x conv2d",
                            "1 x dropout"], report
    assert "afterburner::" in str(fused.graph) and "afterburner::" not in str(module.inlined_graph)
    assert module.code == code_before
    assert all(a is b for a, b in zip(fused.parameters(), module.parameters()))
    assert list(fused.state_dict()) == list(module.state_dict())
    x = torch.randn(batch, 1, 28, 28)
    for mode in ("eval", "train"):
        getattr(fused, mode)(), getattr(module, mode)()
        for _ in range(2):  # a second call gives the same answer
            torch.manual_seed(1)  # the same dropout masks
            got = fused(x)
            got_grads = torch.autograd.grad(got[0].square().sum() + got[1], list(fused.parameters()))
            torch.manual_seed(1)
            want = module(x)
            want_grads = torch.autograd.grad(want[0].square().sum() + want[1], list(module.parameters()))
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
            for g, w in zip(got_grads, want_grads):
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_training_the_copy_trains_the_module_and_the_file_it_saves_loads():
    torch.manual_seed(0)
    module = torch.jit.script(UserNet())
    fused, _ = jit.fuse(module)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)  # built on the module's own tensors
    before = {k: v.clone() for k, v in module.state_dict().items()}
    loss = F.cross_entropy(fused(torch.randn(8, 1, 28, 28))[0], torch.randint(0, 10, (8,)))
    loss.backward()
    optimizer.step()
    after = module.state_dict()
    assert not torch.equal(after["fc.weight"], before["fc.weight"])
    assert not torch.equal(after["bn.running_mean"], before["bn.running_mean"])  # BatchNorm's buffers shared
    buffer = io.BytesIO()
    torch.jit.save(fused.eval(), buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    x = torch.randn(4, 1, 28, 28)
    torch.testing.assert_close(loaded(x), fused(x))
    assert "afterburner::relu_max_pool2d" in str(loaded.inlined_graph)


def test_what_does_not_fuse_is_said_and_bad_input_is_one_error():
    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            return y + y.relu()  # y has other uses: its relu stays

    module = torch.jit.script(Residual())
    fused, report = jit.fuse(module)
    assert report.notices == ["1 relu(s) left unfused: not after a conv2d, linear or add nor before a max_pool2d, "
                              "or their input has other uses"]
    x = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(fused(x), module(x))
    with pytest.raises(TypeError, match="expected a torch.jit.ScriptModule"):
        jit.fuse(UserNet())
    # afterburner.nn.fuse, given a model with no Sequential, points here.
    assert nn.fuse(UserNet()).notices == ["UserNet holds no torch.nn.Sequential, whose order is all fuse sees: "
                                          "afterburner.jit.fuse(torch.jit.script(model)) fuses a forward of its own"]


def test_dropout_of_probability_zero_is_its_input_and_others_draw_as_torch():
    """LibTorch's dropout returns its input for p = 0; TorchScript's executor would draw a mask of
    ones for it. Other probabilities draw on afterburner::dropout: the same masks from the same
    seed as eager torch's dropout, bit for bit, and the generator left where torch's leaves it."""
    class Dropouts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(6, 6)
            self.none = torch.nn.Dropout(0.0)
            self.some = torch.nn.Dropout(0.5)

        def forward(self, x):
            y = self.none(self.fc(x))
            return y, self.some(F.dropout(y, 0.0, True))

    model = Dropouts()
    module = torch.jit.script(model)
    fused, _ = jit.fuse(module)
    graph = str(fused.graph)
    assert graph.count("afterburner::dropout(") == 1 and "aten::dropout(" not in graph  # the p = 0.5 one
    x = torch.randn(4, 6)
    for _ in range(2):
        torch.manual_seed(3)
        got, got_next = fused(x), torch.rand(3)
        torch.manual_seed(3)
        want, want_next = model(x), torch.rand(3)  # eager: the scripted module's executor draws for p = 0 too
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert torch.equal(got_next, want_next)
        assert not torch.equal(fused(x)[1], got[1]), "p = 0.5 draws anew"


class Gelus(torch.nn.Module):
    """GELU as users write it: the module (a constant `approximate` in TorchScript), the function,
    and the tanh form, which stays LibTorch's."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(12, 48)
        self.act = torch.nn.GELU()
        self.out = torch.nn.Linear(48, 5, bias=False)

    def forward(self, x):
        h = self.act(self.fc(x))
        return self.out(F.gelu(h) + F.gelu(h, approximate="tanh"))


@pytest.mark.parametrize("kind", ["script", "trace"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("batch", [1, 7, 300])
def test_gelu_runs_torchs_forward_and_afterburners_gradient(kind, precision, batch):
    torch.manual_seed(0)
    model = Gelus()
    module = torch.jit.script(model) if kind == "script" else torch.jit.trace(model, torch.randn(2, 12))
    fused, report = jit.fuse(module)
    assert "2 x gelu" in report.fused, report
    graph = str(fused.graph)
    assert graph.count("afterburner::gelu(") == 2 and graph.count("aten::gelu(") == 1, graph  # the tanh one
    x = torch.randn(batch, 12)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with autocast:
        want = model(x)
    want_grads = torch.autograd.grad(want.float().square().sum(), list(model.parameters()))
    # fp32: the forward is LibTorch's own, bit for bit, and the gradients a few ulps apart. bf16: a
    # scripted module under autocast rounds otherwise than the eager one (fused or not), and the
    # GELU gradient is rounded once.
    assert_trains_as(fused, x, autocast, want, want_grads, {"fp32": 0.0, "bf16": 2e-2}[precision],
                     {"fp32": 1e-5, "bf16": 2e-2}[precision])


class Norms(torch.nn.Module):
    """LayerNorm as users write it: the module, and the function without weight and bias."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(12, 40)
        self.norm = torch.nn.LayerNorm(40)
        self.out = torch.nn.Linear(40, 5)

    def forward(self, x):
        h = self.norm(self.fc(x))
        return self.out(F.layer_norm(h, [40]) + h)


@pytest.mark.parametrize("kind", ["script", "trace"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("batch", [1, 7, 300])
def test_layer_norm_trains_as_the_modules(kind, precision, batch):
    """fp32 against the module; bf16 (autocast: LayerNorm reads the Linear's bf16 output as it is,
    in fp32) against the module in fp32, which torch 1.13's eager autocast cannot run (its
    layer_norm refuses a bf16 input)."""
    torch.manual_seed(0)
    model = Norms()
    module = torch.jit.script(model) if kind == "script" else torch.jit.trace(model, torch.randn(2, 12))
    fused, report = jit.fuse(module)
    assert "2 x layer_norm" in report.fused, report
    x = torch.randn(batch, 12)
    want = model(x)
    want_grads = torch.autograd.grad(want.square().sum(), list(model.parameters()))
    bound = {"fp32": 1e-5, "bf16": 5e-2}[precision]
    assert_trains_as(fused, x, torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"), want,
                     want_grads, bound, bound)


class ResidualSums(torch.nn.Module):
    """Residual sums and their activations as users write them: SiLU of a BatchNorm'd convolution
    plus the input, relu of two branches, an in-place relu; and three that stay: a scalar added, an
    alpha and a sum read twice."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)
        self.skip = torch.nn.Conv2d(4, 4, 1)
        self.head = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        y = F.silu(self.bn(self.conv(x)) + x)
        z = torch.relu(y + self.skip(x))
        z = F.relu(z + y, inplace=True)
        s = z + y
        kept = torch.relu(z + 1.0) + torch.add(z, y, alpha=2).relu() + torch.relu(s) * s
        return self.head(kept.flatten(1))


@pytest.mark.parametrize("kind", ["script", "trace"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("batch", [1, 7, 64])
def test_residual_sums_and_their_activations_train_as_the_modules(kind, precision, batch):
    """bf16 against the eager module under autocast, which adds in bf16 as the fused op does."""
    torch.manual_seed(0)
    model = ResidualSums()
    module = torch.jit.script(model) if kind == "script" else torch.jit.trace(model, torch.randn(2, 4, 6, 6))
    fused, report = jit.fuse(module)
    assert "3 x add + activation" in report.fused, report
    assert str(fused.graph).count("afterburner::add_activation(") == 3
    x = torch.randn(batch, 4, 6, 6)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with autocast:
        want = model(x)
    want_grads = torch.autograd.grad(want.float().square().sum(), list(model.parameters()))
    bound = {"fp32": 1e-5, "bf16": 3e-2}[precision]
    assert_trains_as(fused, x, autocast, want, want_grads, bound, bound)


class WrittenTerm(torch.nn.Module):
    """A term written in place after its sum: relu keeps its output for the gradient, SiLU would
    keep the terms, so that sum stays LibTorch's (whose SiLU keeps the sum)."""

    def forward(self, x):
        h = x * 2
        y = torch.relu(h + x) + F.silu(h + x)
        h.add_(1)
        return y * h


def test_a_sum_whose_term_is_written_in_place_later_keeps_its_silu_and_trains():
    module = torch.jit.script(WrittenTerm())
    fused, report = jit.fuse(module)
    assert report.fused == ["1 x add + activation"], report
    assert "aten::silu(" in str(fused.graph)
    x = torch.randn(3, 5, requires_grad=True)
    got = torch.autograd.grad(fused(x).sum(), x)[0]
    want = torch.autograd.grad(WrittenTerm()(x).sum(), x)[0]
    torch.testing.assert_close(got, want)


class InvertedResidual(torch.nn.Module):
    """An inverted residual block as torchvision writes them: expand 1x1, a depthwise convolution
    (groups == channels) with BatchNorm and an activation, project 1x1, plus the input; a stride-2
    depthwise convolution without bias after it."""

    def __init__(self, channels=6, expanded=24):
        super().__init__()
        self.expand = torch.nn.Conv2d(channels, expanded, 1, bias=False)
        self.depthwise = torch.nn.Conv2d(expanded, expanded, 5, padding=2, groups=expanded, bias=False)
        self.bn = torch.nn.BatchNorm2d(expanded)
        self.project = torch.nn.Conv2d(expanded, channels, 1)
        self.down = torch.nn.Conv2d(channels, channels, 3, stride=2, padding=1, groups=channels)

    def forward(self, x):
        y = F.hardswish(self.bn(self.depthwise(F.relu(self.expand(x)))))
        return self.down(x + self.project(y))


@pytest.mark.parametrize("kind", ["script", "trace"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_depthwise_convolutions_train_on_afterburners_backward_with_the_modules_gradients(kind, precision):
    torch.manual_seed(0)
    model = InvertedResidual().to(memory_format=torch.channels_last)
    module = torch.jit.script(model) if kind == "script" else torch.jit.trace(model, torch.randn(2, 6, 9, 9))
    fused, report = jit.fuse(module)
    assert report.fused == ["1 x conv2d + relu", "3 x conv2d"], report
    assert "aten::conv2d(" not in str(fused.graph) and "aten::_convolution(" not in str(fused.graph)
    tolerance = dict(rtol=1e-4, atol=1e-5) if precision == "fp32" else dict(rtol=2e-2, atol=2e-2)
    for batch in (1, 2, 7):
        x = torch.randn(batch, 6, 9, 9).to(memory_format=torch.channels_last)
        for _ in range(2):  # a second call gives the same answer
            results = []
            for m in (fused, module):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                    out = m(x)
                grads = torch.autograd.grad(out.float().square().sum(), list(m.parameters()))
                results.append((out, grads))
            (got, got_grads), (want, want_grads) = results
            torch.testing.assert_close(got, want, rtol=0, atol=0)  # the forward is LibTorch's
            for name, g, w in zip([n for n, _ in module.named_parameters()], got_grads, want_grads):
                torch.testing.assert_close(g, w, **tolerance, msg=lambda m: f"{name}: {m}")
