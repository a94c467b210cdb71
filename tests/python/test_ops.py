"""afterburner's ops against the unfused torch ops they replace: values, gradients (autograd and
gradcheck in double), inputs left bitwise unchanged, a second call equal to the first, and the
same op through torch.jit.script, torch.jit.trace, a saved file and inference mode."""
import io

import pytest
import torch
import torch.nn.functional as F

import afterburner
from afterburner.nn import functional as abf

DOUBLE = dict(dtype=torch.double)


def reference_relu_max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    return F.max_pool2d(F.relu(x), kernel_size, stride, padding, dilation, ceil_mode)


def reference_conv2d_relu(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return F.relu(F.conv2d(x, weight, bias, stride, padding, dilation, groups))


def reference_low_rank_linear(x, a, b, bias=None, scale=1.0):
    y = scale * (x @ a) @ b
    return y if bias is None else y + bias


# (fused function, its unfused reference, a function of a batch size making the arguments; the
# tensors among them in double, those to differentiate marked requires_grad)
def relu_max_pool_case(n):
    return (torch.randn(n, 3, 7, 9, **DOUBLE, requires_grad=True), 2), {}


def relu_max_pool_stride_case(n):
    return (torch.randn(n, 2, 11, 10, **DOUBLE, requires_grad=True), 3, 2), dict(padding=1)


def relu_max_pool_rectangular_case(n):  # max_pool2d's own arguments: runs as relu then max_pool2d
    return (torch.randn(n, 2, 9, 10, **DOUBLE, requires_grad=True), (2, 3)), dict(stride=(1, 2), ceil_mode=True)


def linear_relu_case(n):
    return (torch.randn(n, 13, **DOUBLE, requires_grad=True), torch.randn(7, 13, **DOUBLE, requires_grad=True),
            torch.randn(7, **DOUBLE, requires_grad=True)), {}


def linear_relu_no_bias_3d_case(n):
    return (torch.randn(n, 3, 5, **DOUBLE, requires_grad=True), torch.randn(4, 5, **DOUBLE, requires_grad=True),
            None), {}


def conv2d_relu_case(n):
    return (torch.randn(n, 3, 9, 8, **DOUBLE, requires_grad=True), torch.randn(5, 3, 3, 3, **DOUBLE, requires_grad=True),
            torch.randn(5, **DOUBLE, requires_grad=True)), dict(stride=2, padding=1)


def conv2d_relu_groups_no_bias_case(n):
    return (torch.randn(n, 4, 7, 7, **DOUBLE, requires_grad=True),
            torch.randn(6, 2, 3, 3, **DOUBLE, requires_grad=True), None), dict(padding=[1, 2], dilation=2, groups=2)


def cross_entropy_case(n):
    return (torch.randn(n, 10, **DOUBLE, requires_grad=True), torch.randint(0, 10, (n,))), {}


def low_rank_linear_case(n):
    return (torch.randn(n, 17, **DOUBLE, requires_grad=True), torch.randn(17, 4, **DOUBLE, requires_grad=True),
            torch.randn(4, 9, **DOUBLE, requires_grad=True), torch.randn(9, **DOUBLE, requires_grad=True)), \
        dict(scale=0.25)


CASES = {
    "relu_max_pool2d": (abf.relu_max_pool2d, reference_relu_max_pool2d, relu_max_pool_case),
    "relu_max_pool2d_k3_s2_pad1": (abf.relu_max_pool2d, reference_relu_max_pool2d, relu_max_pool_stride_case),
    "relu_max_pool2d_rectangular": (abf.relu_max_pool2d, reference_relu_max_pool2d, relu_max_pool_rectangular_case),
    "linear_relu": (abf.linear_relu, lambda x, w, b: F.relu(F.linear(x, w, b)), linear_relu_case),
    "linear_relu_no_bias_3d": (abf.linear_relu, lambda x, w, b: F.relu(F.linear(x, w, b)),
                               linear_relu_no_bias_3d_case),
    "conv2d_relu": (abf.conv2d_relu, reference_conv2d_relu, conv2d_relu_case),
    "conv2d_relu_groups_no_bias": (abf.conv2d_relu, reference_conv2d_relu, conv2d_relu_groups_no_bias_case),
    "cross_entropy": (abf.cross_entropy, F.cross_entropy, cross_entropy_case),
    "low_rank_linear": (abf.low_rank_linear, reference_low_rank_linear, low_rank_linear_case),
}


def detached(args):
    return tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                 for a in args)


def differentiable(args):
    return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_values_and_gradients_match_torch(name, batch):
    fused, reference, case = CASES[name]
    args, kwargs = case(batch)
    originals = [a.detach().clone() for a in args if isinstance(a, torch.Tensor)]
    expected = reference(*args, **kwargs)
    expected_grads = torch.autograd.grad(expected.sum(), differentiable(args))
    for call in range(2):  # a second call gives the same answer
        ours_args = detached(args)
        y = fused(*ours_args, **kwargs)
        torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12, msg=f"{name}, call {call + 1}")
        grads = torch.autograd.grad(y.sum(), differentiable(ours_args))
        for got, want in zip(grads, expected_grads):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=f"{name} gradient, call {call + 1}")
        inputs_after = [a.detach() for a in ours_args if isinstance(a, torch.Tensor)]
        for before, after in zip(originals, inputs_after):
            assert torch.equal(before, after), f"{name} changed an input"


@pytest.mark.parametrize("name", CASES)
def test_gradcheck(name):
    fused, _, case = CASES[name]
    args, kwargs = case(3)
    if name.startswith("relu_max_pool2d"):  # keep finite differences away from ReLU's kink
        args = (args[0].detach().abs().add(0.1).requires_grad_(),) + args[1:]
    assert torch.autograd.gradcheck(lambda *a: fused(*a, **kwargs), args)


@pytest.mark.parametrize("name", CASES)
def test_without_grad_and_in_inference_mode(name):
    fused, reference, case = CASES[name]
    args, kwargs = case(4)
    plain = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    expected = reference(*plain, **kwargs)
    y = fused(*plain, **kwargs)
    assert not y.requires_grad and y.grad_fn is None
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    with torch.inference_mode():  # below autograd: the CPU kernel
        inference = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in plain)
        torch.testing.assert_close(fused(*inference, **kwargs), expected, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        y = fused(*args, **kwargs)
    assert y.grad_fn is None


def test_only_the_inputs_that_require_grad_get_gradients():
    x = torch.randn(6, 13, **DOUBLE)
    weight = torch.randn(7, 13, **DOUBLE, requires_grad=True)
    bias = torch.randn(7, **DOUBLE)
    y = abf.linear_relu(x, weight, bias)
    (grad_weight,) = torch.autograd.grad(y.sum(), [weight])
    expected = torch.autograd.grad(F.relu(F.linear(x, weight, bias)).sum(), [weight])[0]
    torch.testing.assert_close(grad_weight, expected)


class UsesEveryOp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 4 * 4, 16)
        self.a = torch.nn.Parameter(torch.randn(16, 3) * 0.3)
        self.b = torch.nn.Parameter(torch.randn(3, 10) * 0.3)

    def forward(self, x, target):
        x = abf.conv2d_relu(x, self.conv.weight, self.conv.bias, 1, 1)
        x = abf.relu_max_pool2d(x, 2)
        x = abf.linear_relu(x.flatten(1), self.fc.weight, self.fc.bias)
        logits = abf.low_rank_linear(x, self.a, self.b, None, 0.5)
        return logits, abf.cross_entropy(logits, target)


def reference_forward(model, x, target):
    x = F.max_pool2d(F.relu(F.relu(model.conv(x))), 2)
    x = F.relu(model.fc(x.flatten(1)))
    logits = 0.5 * (x @ model.a) @ model.b
    return logits, F.cross_entropy(logits, target)


def loaded(module):
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


@pytest.mark.parametrize("compile", ["script", "trace"])
def test_every_op_inside_torchscript_and_a_saved_file(compile):
    model = UsesEveryOp()
    x, target = torch.randn(3, 1, 8, 8), torch.randint(0, 10, (3,))
    compiled = torch.jit.script(model) if compile == "script" else torch.jit.trace(model, (x, target))
    graph = str(compiled.inlined_graph)
    for op in ("conv2d_relu", "relu_max_pool2d", "linear_relu", "low_rank_linear", "cross_entropy"):
        assert f"afterburner::{op}" in graph
    expected_logits, expected_loss = reference_forward(model, x, target)
    expected_grads = torch.autograd.grad(expected_loss, list(model.parameters()))
    for module in (compiled, loaded(compiled)):
        for _ in range(2):
            logits, loss = module(x, target)
            torch.testing.assert_close(logits, expected_logits, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
            grads = torch.autograd.grad(loss, list(module.parameters()))
            for got, want in zip(grads, expected_grads):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_bf16_autocast_runs_in_bf16_like_torch():
    x = torch.randn(8, 32)
    weight, bias = torch.randn(16, 32), torch.randn(16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = abf.linear_relu(x, weight, bias)
        expected = F.relu(F.linear(x, weight, bias))
        loss = abf.cross_entropy(y, torch.randint(0, 16, (8,)))
    assert y.dtype == expected.dtype == torch.bfloat16
    assert loss.dtype == torch.float32
    torch.testing.assert_close(y.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_bad_arguments_are_one_clear_error():
    with pytest.raises(RuntimeError, match="linear_relu"):
        abf.linear_relu(torch.randn(2, 3), torch.randn(4, 5), None)
    with pytest.raises(RuntimeError, match="target"):
        abf.cross_entropy(torch.randn(2, 3), torch.tensor([0, 3]))
    with pytest.raises(RuntimeError, match="kernel_size"):
        abf.relu_max_pool2d(torch.randn(1, 1, 4, 4), 0)
    with pytest.raises(RuntimeError, match="activation: unknown activation 'gelu', expected relu or silu"):
        torch.ops.afterburner.add_activation(torch.randn(3), torch.randn(3), "gelu")


def test_the_package_loads_its_ops_once():
    import importlib
    importlib.reload(afterburner)  # loading the library again must not register the ops twice
    assert abf.linear_relu(torch.ones(1, 2), torch.ones(3, 2)).shape == (1, 3)
