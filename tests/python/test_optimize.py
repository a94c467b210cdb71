"""afterburner.optimize on eager models as users write them (custom forwards, BatchNorm, Dropout,
attention, torchvision's architectures), against the same module run by PyTorch: outputs, losses,
gradients and parameters after steps, in training and inference, fp32 and bf16, at batch 1, 2, 7
and 64, twice; the optimizer's swap with its state; train()/eval(); copies; bad input."""
import copy
import io
import warnings

import pytest
import torch
import torch.nn.functional as F
import torchvision

import afterburner
from afterburner.optim import FlatAdamW, FlatSGD
from torchvision.ops import StochasticDepth

from image_models import MODELS
from bounds import expect_python, python_bf16

EAGER = sorted(name for name, (_, kind) in MODELS.items() if kind == "script")


def build(name):
    torch.manual_seed(0)
    return MODELS[name][0]()


def in_channels_last(module):
    """The module as PyTorch's best practice runs it (4-D weights channels_last)."""
    module = copy.deepcopy(module)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 4:
                p.data = torch.ops.afterburner.channels_last(p)
    return module


def reference_call(module, x):
    return module(torch.ops.afterburner.channels_last(x))


def net_call(module, x):
    return module(x)


def images(batch, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 1, 28, 28, generator=generator), torch.randint(0, 10, (batch,), generator=generator)


def stepped(net, optimizer, call, x, y, seed):
    """One SGD step of `net` on (x, y): its loss and gradients."""
    torch.manual_seed(seed)  # the same dropout masks
    loss = F.cross_entropy(call(net, x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return [loss.detach()] + [p.grad.clone() for p in net.parameters()]


def without_random_draws(module):
    """The module with Dropout, stochastic depth and attention dropout in evaluation mode: after
    its first call TorchScript's executor draws their masks otherwise than eager mode does (its
    own lowering, PyTorch's behaviour), and the optimized forward is TorchScript's."""
    for m in module.modules():
        if isinstance(m, (torch.nn.modules.dropout._DropoutNd, StochasticDepth, torch.nn.MultiheadAttention)):
            m.eval()
    return module


@pytest.mark.parametrize("name", EAGER)
def test_training_steps_as_the_module_does(name):
    """Three steps (batch 7, 64, 16) against the eager module channels_last, as ours, and NCHW.
    Gradients through BatchNorm over few values (ResNet-18's last stage is 1x1 pixels at 28) are
    ill-conditioned: PyTorch's own NCHW and channels_last runs differ by 0.4% of their scale
    after two steps, and by more than the gradients' scale at batch 2 (so training steps skip
    it), so each figure is held to 1e-3 of its scale or to twice what PyTorch's own layouts
    disagree by, whichever is more."""
    module = without_random_draws(build(name))
    runs = [(net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, nesterov=True))
            for net in (module, in_channels_last(module), copy.deepcopy(module))]
    model, optimizer = runs[0] = afterburner.optimize(*runs[0])
    assert type(model) is type(module) and model is not module and isinstance(optimizer, FlatSGD)
    assert list(model.state_dict()) == list(module.state_dict())
    before = copy.deepcopy(module.state_dict())
    names = ["loss"] + [f"the gradient of {parameter}" for parameter, _ in module.named_parameters()]
    for step, batch in enumerate([7, 64, 16]):
        x, y = images(batch, seed=step)
        ours, want, other = (stepped(net, opt, call, x, y, step)
                             for (net, opt), call in zip(runs, (net_call, reference_call, net_call)))
        for what, got, expected, nchw in zip(names, ours, want, other):
            expect_within_pytorch(got, expected, nchw, f"step {step}: {what}")
    for (parameter, got), want, nchw in zip(model.named_parameters(), runs[1][0].parameters(),
                                            runs[2][0].parameters()):
        expect_within_pytorch(got.detach(), want.detach(), nchw.detach(), f"{parameter} after 3 steps")
    assert all(torch.equal(value, before[key]) for key, value in module.state_dict().items()), "the original moved"
    eager = runs[1][0].eval()
    eager.load_state_dict(model.state_dict())
    model.eval()
    for batch in (1, 2, 7):
        x, _ = images(batch)
        want = reference_call(eager, x)
        for _ in range(2):
            expect_python(model(x), want, "fp32")


def expect_within_pytorch(got, want, other_layout, what):
    bound = max(1e-5 + 1e-3 * want.abs().max().item(), 2 * (other_layout - want).abs().max().item())
    difference = (got - want).abs().max().item()
    assert difference <= bound, f"{what} differs by {difference:.3g} (bound {bound:.3g})"


def with_drawn_classifiers(module):
    """`module` with any Linear layer initialised at zero (torchvision's VisionTransformer head)
    drawn at random: an all-zero output would hide every difference."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.Linear) and not m.weight.any():
                torch.nn.init.normal_(m.weight, std=0.1)
    return module


@pytest.mark.parametrize("name", EAGER)
def test_inference_answers_as_the_module_frozen_and_with_gradients(name):
    module = with_drawn_classifiers(build(name)).eval()
    model = afterburner.optimize(module)
    for batch in (1, 2, 7, 64):
        x, _ = images(batch)
        with torch.no_grad():
            want = module(x)
            first = model(x)
            expect_python(first, want, "fp32")
            assert torch.equal(model(x), first), "a second call answered otherwise"
    for batch in (1, 2):
        x, _ = images(batch)
        got = torch.autograd.grad(model(x).square().sum(), list(model.parameters()))  # gradients: not frozen
        want = torch.autograd.grad(module(x).square().sum(), list(module.parameters()))
        for (parameter, _), g, w in zip(module.named_parameters(), got, want):
            expect_within_pytorch(g, w, w, f"batch {batch}: the gradient of {parameter}")


@pytest.mark.parametrize("name", ["resnet18", "vision_transformer", "convnext", "rows_gelu", "residual_attention", "bn_dropout"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_bf16_answers_within_what_python_bf16_moves(name, mode):
    module = without_random_draws(getattr(build(name), mode)())
    model = afterburner.optimize(module, dtype=torch.bfloat16)
    x, _ = images(7)
    moves, _ = python_bf16(in_channels_last(module), x)  # in the same mode
    with torch.no_grad():
        torch.manual_seed(0)
        want = reference_call(in_channels_last(module), x)
        torch.manual_seed(0)
        got = model(x)
        assert got.dtype == torch.float32
        expect_python(got, want, "bf16", moves)
        if mode == "train":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                assert model(x).dtype == torch.bfloat16, "under the caller's autocast, autocast's dtypes"


@pytest.mark.parametrize("name", ["resnet18", "residual_attention", "rows_transformer"])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_a_second_call_gives_the_same_outputs_and_gradients_bit_for_bit(name, dtype):
    module = without_random_draws(build(name))
    model = afterburner.optimize(module, torch.optim.SGD(module.parameters(), lr=0.1), dtype=dtype)[0]
    x, y = images(5)
    calls = []
    for _ in range(3):
        loss = F.cross_entropy(model(x), y)
        calls.append([loss.detach()] + list(torch.autograd.grad(loss, list(model.parameters()))))
    for later in calls[1:]:
        assert all(torch.equal(a, b) for a, b in zip(calls[0], later))


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_evaluation_under_inference_mode_after_training_steps(dtype):
    """Python users evaluate under torch.inference_mode(); a profiled TorchScript plan of the
    training steps saves inference tensors for backward there (PyTorch 1.13 fails so on the
    scripted module). And a first call under inference_mode leaves later steps their gradients."""
    module = build("rows_transformer")
    model, optimizer = afterburner.optimize(module, torch.optim.SGD(module.parameters(), lr=0.1), dtype=dtype)
    model.eval()
    with torch.inference_mode():
        model(images(8)[0])
    model.train()
    for seed in range(3):
        x, y = images(8, seed)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        assert all(p.grad is not None for p in model.parameters())
        optimizer.step()
    model.eval()
    with torch.no_grad():
        want = model(x)
    with torch.inference_mode():
        assert torch.equal(model(x), want)


@pytest.mark.parametrize("name, ours, native, calls", [
    ("vision_transformer", "afterburner::self_attention", "aten::_native_multi_head_attention", 2),
    ("residual_attention", "afterburner::self_attention", "aten::_native_multi_head_attention", 1),
    ("rows_transformer", "afterburner::encoder_layer", "aten::_transformer_encoder_layer_fwd", 2)])
def test_attentions_fast_paths_run_on_our_kernels(name, ours, native, calls):
    """In evaluation MultiheadAttention and TransformerEncoderLayer call PyTorch's fast paths,
    which afterburner.optimize runs on our kernels (src/infer/attention_fast_paths.cpp): every
    layer's call, the native op never running (ResidualAttention asks for the weights, as
    MultiheadAttention does by default, and drops them), with the module's answers (the inference
    test above checks them at four batches)."""
    module = with_drawn_classifiers(build(name)).eval()
    model = afterburner.optimize(module)
    x, _ = images(3)
    with torch.no_grad(), torch.profiler.profile() as profile:
        expect_python(model(x), module(x).clone(), "fp32")
    graph = str(model.forward._frozen.graph)
    assert graph.count(ours) == calls, graph
    assert native not in graph
    ran = {event.key: event.count for event in profile.key_averages()}
    assert ran.get(native) == calls, "only the eager module's calls run the native op"


class DefaultAttention(torch.nn.Module):
    """nn.MultiheadAttention as its defaults make it (sequence first, dropout 0.1): PyTorch runs
    its composed forward in evaluation too, whose bmm-softmax-bmm runs on our fused kernel."""

    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(32, 4, dropout=0.1)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x):
        tokens = x.squeeze(1).transpose(0, 1)  # [28 tokens, batch, 32 features]: sequence first
        attended, _ = self.attention(tokens, tokens, tokens, need_weights=False)
        return self.head(attended.mean(0))


def test_multihead_attentions_composed_forward_runs_on_our_kernel():
    torch.manual_seed(0)
    module = DefaultAttention().eval()
    model = afterburner.optimize(module)
    for batch in (1, 2, 7):
        x = torch.randn(batch, 1, 28, 32)
        with torch.no_grad():
            first = model(x)
            expect_python(first, module(x), "fp32")
            assert torch.equal(model(x), first), "a second call answered otherwise"
    assert "afterburner::attention" in str(model.forward._frozen.graph)


def test_densenets_batchnorms_after_convolutions_fold():
    """torchvision's DenseNet checks each BatchNorm's input rank; after an in-place ReLU freezing
    cannot drop the check on norm2's input, whose extra use of the 1x1 convolution's output used
    to stop the folding: now every BatchNorm that follows a convolution folds. Its blocks'
    concatenations run in growing buffers (src/infer/channel_concat.cpp): the answers cover them."""
    torch.manual_seed(0)
    module = torchvision.models.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2,
                                         num_classes=10).eval()
    names = [name for name, m in module.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]
    after_convolutions = [name for name in names if name.endswith(("norm0", "norm2"))]
    _, passes = torch.ops.afterburner.optimize_for_inference(torch.jit.script(module)._c, "fp32")
    assert f"BatchNorm: {len(after_convolutions)} of {len(names)} removed" in " ".join(passes), passes
    model = afterburner.optimize(module)
    for batch in (1, 2, 7):
        x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            first = model(x)
            expect_python(first, module(x), "fp32")
            assert torch.equal(model(x), first), "a second call answered otherwise"


def test_inference_refreezes_when_the_weights_change():
    module = build("residual").eval()
    model = afterburner.optimize(module)
    torch.manual_seed(5)
    other = MODELS["residual"][0]().eval()
    x, _ = images(4)
    with torch.no_grad():
        expect_python(model(x), module(x), "fp32")
        model.load_state_dict(other.state_dict())
        expect_python(model(x), other(x), "fp32")
        model.stem.weight.mul_(2)  # in place, as an optimizer step
        other.stem.weight.mul_(2)
        expect_python(model(x), other(x), "fp32")


@pytest.mark.parametrize("built_in_inference_mode", [False, True])
def test_optimize_called_under_inference_mode(built_in_inference_mode):
    """Serving code often wraps everything in torch.inference_mode(), optimize too (it failed there:
    "Inference tensors do not track version counter"); a module built there has inference tensors
    for weights. Either way the optimized copy answers as the module, twice, and follows a load."""
    with torch.inference_mode(built_in_inference_mode):
        module = build("residual").eval()
    torch.manual_seed(5)
    other = MODELS["residual"][0]().eval()
    x, _ = images(5)
    with torch.inference_mode():
        model = afterburner.optimize(module)
        first = model(x)
        expect_python(first, module(x), "fp32")
        assert torch.equal(model(x), first), "a second call answered otherwise"
    with torch.no_grad():
        model.load_state_dict(other.state_dict())
        expect_python(model(x), other(x), "fp32")


def test_train_and_eval_of_any_submodule_reach_the_compiled_forward():
    module = build("bn_dropout")
    reference = in_channels_last(module)
    model, _ = afterburner.optimize(module, torch.optim.SGD(module.parameters(), lr=0.1))
    x, _ = images(8)
    for mode, submodule in (("eval", ""), ("train", "1"), ("train", "6"), ("eval", "")):  # BatchNorm2d, 1d
        for net in (model, reference):
            getattr(dict(net.named_modules())[submodule], mode)()
        for _ in range(2):
            expect_python(model(x), reference_call(reference, x), "fp32")
    for submodule in ("3", "8", ""):  # each Dropout, then all: the masks are drawn anew at each call
        dict(model.named_modules())[submodule].train()
        assert not torch.equal(model(x), model(x)), f"module '{submodule}' in training mode draws no dropout"
        model.eval()


@pytest.mark.parametrize("kind", ["SGD", "AdamW"])
def test_the_optimizer_swap_carries_groups_and_state(kind):
    module = build("residual")
    reference = copy.deepcopy(module)
    groups = lambda m: [{"params": [m.stem.weight, m.stem.bias], "lr": 0.02},  # noqa: E731
                        {"params": [p for n, p in m.named_parameters() if not n.startswith("stem")]}]
    make = {"SGD": lambda g: torch.optim.SGD(g, lr=0.05, momentum=0.9, weight_decay=1e-3),
            "AdamW": lambda g: torch.optim.AdamW(g, lr=1e-3, weight_decay=0.05)}[kind]
    optimizer, reference_optimizer = make(groups(module)), make(groups(reference))
    steps = [images(5, seed) for seed in range(4)]

    def step(net, opt, batch):
        opt.zero_grad()
        F.cross_entropy(net(batch[0]), batch[1]).backward()
        opt.step()

    for batch in steps[:2]:  # the user has trained for a while with torch's optimizer
        step(module, optimizer, batch)
        step(reference, reference_optimizer, batch)
    model, swapped = afterburner.optimize(module, optimizer)
    assert type(swapped) is {"SGD": FlatSGD, "AdamW": FlatAdamW}[kind]
    assert [g["lr"] for g in swapped.param_groups] == [0.02, 0.05 if kind == "SGD" else 1e-3]
    assert swapped.param_groups[0]["params"][0] is model.stem.weight
    state = swapped.state[model.stem.weight]
    want = reference_optimizer.state[reference.stem.weight]
    assert set(state) == set(want) and all(torch.equal(state[k].float(), want[k].float()) for k in want)
    for batch in steps[2:]:
        step(model, swapped, batch)
        step(reference, reference_optimizer, batch)
    for (parameter, got), want in zip(model.named_parameters(), reference.parameters()):
        expect_within_pytorch(got.detach(), want.detach(), want.detach(), parameter)


def test_optimizers_without_a_fused_version_step_the_copy():
    module = build("residual")
    for optimizer in (torch.optim.RMSprop(module.parameters(), lr=0.01),
                      torch.optim.SGD(module.parameters(), lr=0.01, maximize=True)):
        model, kept = afterburner.optimize(module, optimizer)
        assert type(kept) is type(optimizer) and kept is not optimizer
        before = [p.clone() for p in module.parameters()]
        x, y = images(4)
        F.cross_entropy(model(x), y).backward()
        kept.step()
        assert all(torch.equal(a, b) for a, b in zip(module.parameters(), before)), "the original moved"
        assert not torch.equal(model.stem.weight, module.stem.weight), "the copy did not"


def test_inplace_keeps_the_objects_it_can():
    module = build("residual")
    optimizer = torch.optim.RMSprop(module.parameters(), lr=0.01)
    model, kept = afterburner.optimize(module, optimizer, inplace=True)
    assert model is module and kept is optimizer
    model, swapped = afterburner.optimize(module, torch.optim.SGD(module.parameters(), lr=0.01), inplace=True)
    assert model is module and swapped.param_groups[0]["params"][0] is module.stem.weight


def test_schedulers_made_before_are_warned_of_and_after_drive_the_returned_optimizer():
    module = build("residual")
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    with pytest.warns(UserWarning, match="LR scheduler drives the optimizer given"):
        model, optimizer = afterburner.optimize(module, optimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stepped in the order PyTorch asks for
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


def test_copies_and_saved_modules_stay_optimized_and_independent():
    module = build("residual_attention")
    model, optimizer = afterburner.optimize(module, torch.optim.SGD(module.parameters(), lr=0.1))
    x, y = images(6)
    model.eval()
    want = model(x)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for twin in (copy.deepcopy(model), torch.load(buffer)):
        assert torch.equal(twin(x), want)
        assert "afterburner::attention" in str(twin.forward._fused.module.graph)
        twin.train()
        F.cross_entropy(twin(x), y).backward()
        torch.optim.SGD(twin.parameters(), lr=0.1).step()
        assert torch.equal(model(x), want), "training a copy moved the original"


def test_torch_jit_script_and_a_second_optimize_see_the_users_forward(tmp_path):
    module = build("residual")
    model, optimizer = afterburner.optimize(module, torch.optim.SGD(module.parameters(), lr=0.1))
    x, y = images(6)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    scripted = torch.jit.script(model.eval())
    assert "afterburner" not in str(scripted.inlined_graph) and scripted.stem.weight is model.stem.weight
    scripted.save(str(tmp_path / "model.pt"))
    loaded = torch.jit.load(str(tmp_path / "model.pt"))
    served = afterburner.optimize(model)  # trained, then optimized again for inference
    with torch.no_grad():
        expect_python(loaded(x), model(x), "fp32")
        expect_python(served(x), model(x), "fp32")
    assert served is not model and served.forward._frozen is not None


class Unscriptable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(784, 10)

    def forward(self, x):
        return self.fc(x.flatten(1)) * len({id(x)})  # sets of objects: Python only


def test_bad_input_is_one_clear_error():
    module = build("residual")
    with pytest.raises(TypeError, match="expected a torch.nn.Module, got RecursiveScriptModule.*afterburner.jit.fuse"):
        afterburner.optimize(torch.jit.script(module))
    with pytest.raises(ValueError, match="dtype torch.float16 is not supported"):
        afterburner.optimize(module, dtype=torch.float16)
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer, got list"):
        afterburner.optimize(module, [])
    stranger = torch.nn.Parameter(torch.zeros(3, 5))
    with pytest.raises(ValueError, match=r"param group 0 holds a tensor of shape \[3, 5\] that is not a parameter"):
        afterburner.optimize(module, torch.optim.SGD([stranger], lr=0.1))
    with pytest.raises(RuntimeError, match="TorchScript cannot compile Unscriptable: .*training needs a scriptable"):
        afterburner.optimize(Unscriptable())
    with pytest.raises(RuntimeError, match="TorchScript cannot compile Unscriptable: .*pass sample_input="):
        afterburner.optimize(Unscriptable().eval())
    unscriptable = Unscriptable().eval()
    x, _ = images(3)
    traced = afterburner.optimize(unscriptable, sample_input=x)
    with torch.no_grad():
        expect_python(traced(x), unscriptable(x), "fp32")
