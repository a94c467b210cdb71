"""afterburner.optimize: one call that makes an eager nn.Module and its optimizer fast (ipex.optimize's contract).

    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = afterburner.optimize(model, optimizer, dtype=torch.bfloat16)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=1000)
    for x, y in loader:                                  # float32 images, as before
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(); loss.backward(); optimizer.step(); scheduler.step()

    served = afterburner.optimize(model.eval())          # inference: frozen, BatchNorm folded
    with torch.no_grad():
        logits = served(images)

The model returned is the module given (a deep copy unless inplace=True): its class, parameters,
buffers, state_dict keys and train()/eval() are the user's; only its forward changes (hooks on
the module itself run; hooks on its submodules do not, as in any TorchScript forward).
- Training (an optimizer given, or the model in training mode): the module is scripted and its
  forward fused (afterburner.jit.fuse: conv/linear + ReLU, ReLU + max-pool, nn.MultiheadAttention
  on the fused attention, dropout with torch's masks drawn in bulk), sharing its parameters; convolution weights and 4-D inputs go
  channels_last (where the model has 4-D weights, unless channels_last=False). dtype=bfloat16
  runs the forward under CPU bf16 autocast with float32 weights (master copies need no split:
  the weights stay float32), and returns float32 outputs unless the caller's own autocast is on.
  torch.optim.SGD and AdamW become afterburner.optim.FlatSGD and FlatAdamW, state and param
  groups carried over (others step as they are, on the copy's parameters). LR schedulers must be
  made from the optimizer returned. With an optimizer the process keeps freed memory from then on
  (afterburner.heap.keep_freed_memory(), as `afterburner train` does), so each step reuses the last
  one's activations instead of page-faulting them anew; afterburner.heap.release_freed_memory()
  hands it back.
- Inference (no optimizer, the model in evaluation mode): calls under torch.no_grad() or
  inference_mode run the model frozen, BatchNorm folded into convolutions, on oneDNN's layouts with
  prepacked weights (as `afterburner optimize` and `serve` run files), in bf16 if asked (taking
  and returning float32); refrozen when a parameter or buffer changed. Calls that may need
  gradients, or in training mode, run the training forward above, so answers and gradients stay
  the module's.

A model TorchScript cannot compile is refused in one line naming it; for inference,
sample_input= traces it instead (a trace records one mode's BatchNorm and Dropout, so training
never uses one). copy.deepcopy and torch.save of the returned module keep it optimized: the copy
compiles itself again at its first call. torch.jit.script(model) scripts the module's own forward,
a plain TorchScript file for `afterburner optimize`, `serve`, or Python without afterburner.
"""
import copy
import inspect
import warnings
import weakref
from typing import Any, Optional

import torch

from . import heap, jit
from .optim import FlatAdamW, FlatSGD

__all__ = ["optimize"]

_PRECISION = {None: "fp32", torch.float32: "fp32", torch.bfloat16: "bf16"}

# torch's optimizer -> (afterburner's fused one, the flags that keep torch's)
_FUSED_OPTIMIZERS = {
    torch.optim.SGD: (FlatSGD, ("maximize", "differentiable")),
    torch.optim.AdamW: (FlatAdamW, ("amsgrad", "maximize", "capturable", "differentiable")),
}


def optimize(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
             dtype: Optional[torch.dtype] = None, *, inplace: bool = False, channels_last: Optional[bool] = None,
             sample_input: Any = None):
    """The model made fast (and the optimizer, when given: then a (model, optimizer) pair)."""
    _check_arguments(model, optimizer, dtype)
    if optimizer is not None:
        _check_parameters_of(model, optimizer)
    inference = optimizer is None and not model.training
    # Under torch.inference_mode() the copy's and the layout's tensors would be inference tensors,
    # which neither autograd nor the version counters that tell us of changed weights can follow.
    with torch.inference_mode(False):
        return _optimized(model, optimizer, dtype, inference, inplace, channels_last, sample_input)


def _optimized(model, optimizer, dtype, inference, inplace, channels_last, sample_input):
    if _driven_by_scheduler(optimizer) and (not inplace or _fused_class(optimizer)):
        warnings.warn("afterburner.optimize: an LR scheduler drives the optimizer given, not the one returned; "
                      "make schedulers from the optimizer afterburner.optimize returns", stacklevel=3)
    if not inplace:
        model, optimizer = copy.deepcopy((model, optimizer))  # one memo: the copy's optimizer holds the copy's params
        _drop_scheduler_hook(optimizer)
    if optimizer is not None:
        optimizer = _fused_optimizer(optimizer)
        heap.keep_freed_memory()
    layout = any(p.dim() == 4 for p in model.parameters()) if channels_last is None else channels_last
    if layout:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 4:
                    p.data = torch.ops.afterburner.channels_last(p)
    forward = _OptimizedForward(model, _PRECISION[dtype], inference, layout, sample_input)
    forward.build()
    model.forward = forward
    model.__prepare_scriptable__ = forward.plain_module  # torch.jit.script(model) scripts the user's forward
    return model if optimizer is None else (model, optimizer)


def _check_arguments(model, optimizer, dtype):
    if isinstance(model, torch.jit.ScriptModule) or not isinstance(model, torch.nn.Module):
        raise TypeError(f"afterburner.optimize: expected a torch.nn.Module, got {type(model).__name__} (for a "
                        "TorchScript module use afterburner.jit.fuse, or `afterburner optimize FILE`)")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"afterburner.optimize: optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if dtype not in _PRECISION:
        raise ValueError(f"afterburner.optimize: dtype {dtype} is not supported: None (float32) or torch.bfloat16 "
                         "(LibTorch's CPU autocast computes bf16 only)")
    if dtype == torch.bfloat16 and not torch.ops.afterburner.cpu_has_native_bf16():
        warnings.warn("afterburner.optimize: this CPU has no native bf16 (AVX512-BF16 or AMX): bf16 is emulated "
                      "and slower than float32", stacklevel=3)


def _driven_by_scheduler(optimizer):
    return optimizer is not None and getattr(optimizer.step, "_with_counter", False)


def _drop_scheduler_hook(optimizer):
    """A scheduler's counting wrapper on the optimizer's step, deep-copied, would step the original."""
    if optimizer is not None and getattr(vars(optimizer).get("step"), "_with_counter", False):
        del optimizer.step


def _check_parameters_of(model, optimizer):
    owned = {id(p) for p in model.parameters()}
    for index, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            if id(p) not in owned:
                raise ValueError(f"afterburner.optimize: the optimizer's param group {index} holds a tensor of shape "
                                 f"{list(p.shape)} that is not a parameter of the model")


def _fused_class(optimizer):
    """afterburner's version of the optimizer, None where it has none for these flags or tensors."""
    fused, kept_by = _FUSED_OPTIMIZERS.get(type(optimizer), (None, ()))
    groups = optimizer.param_groups
    flagged = any(group.get(flag) for flag in kept_by for group in groups)
    fp32_cpu = all(p.dtype == torch.float32 and p.device.type == "cpu" for group in groups for p in group["params"])
    return fused if fp32_cpu and not flagged else None


def _fused_optimizer(optimizer):
    """torch's SGD and AdamW as afterburner's fused ones, with their param groups and state; others as given."""
    fused = _fused_class(optimizer)
    if fused is None:
        return optimizer
    accepted = inspect.signature(fused).parameters  # torch's Optimizer adds `differentiable` to every one's
    swapped = fused(optimizer.param_groups, **{k: v for k, v in optimizer.defaults.items() if k in accepted})
    swapped.load_state_dict(optimizer.state_dict())
    return swapped


def _scripted(model, inference, sample_input):
    try:
        return torch.jit.script(model)
    except Exception as error:  # TorchScript's errors are several classes, each many lines long
        reason = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
        if not inference or sample_input is None:
            hint = ("pass sample_input= to trace it for inference" if inference else
                    "training needs a scriptable forward (a trace records one mode's BatchNorm and Dropout)")
            raise RuntimeError(f"afterburner.optimize: TorchScript cannot compile {type(model).__name__}: {reason}; "
                               f"{hint}") from None
    inputs = sample_input if isinstance(sample_input, tuple) else (sample_input,)
    return torch.jit.trace(model, inputs)


def _in_float32(output):
    """bf16 tensors of a (nested) output as float32, what the module given returns."""
    if isinstance(output, torch.Tensor):
        return output.float() if output.dtype == torch.bfloat16 else output
    if isinstance(output, (tuple, list)):
        return type(output)(_in_float32(o) for o in output)
    if isinstance(output, dict):
        return {key: _in_float32(value) for key, value in output.items()}
    return output


class _FusedCopy:
    """A fused copy of the scripted module, sharing its parameters and buffers, that the module's
    submodules' train()/eval() flags reach at each call."""

    def __init__(self, script, module):
        self.module, _ = jit.fuse(script)
        scripted = dict(self.module.named_modules())
        pairs = [(m, scripted[name]) for name, m in module.named_modules() if name in scripted]
        self._eager, self._scripted = [m for m, _ in pairs], [s for _, s in pairs]
        self._flags = None  # as last set on the copy: reading a ScriptModule's attribute is slow
        self._called = False

    def __call__(self, *args, **kwargs):
        flags = [m.training for m in self._eager]
        if flags != self._flags:
            for scripted, flag in zip(self._scripted, flags):
                scripted.training = flag
            self._flags = flags
        if self._called:
            return self.module(*args, **kwargs)
        # As `train --model` runs its model (train/model.cpp): TorchScript's executor profiles a
        # function's first call and runs later ones on a plan optimized from that profile, whose
        # derivatives round otherwise, and whose differentiable graphs save their inputs for
        # backward even under torch.inference_mode, which then fails ("Inference tensors cannot
        # be saved for backward", as Python's own scripted TransformerEncoder does after a
        # training step). Without profiling every call runs one plan, and a second call gives the
        # first one's gradients. The count is read when a function first runs.
        previous = torch._C._jit_set_num_profiled_runs(0)
        try:
            return self.module(*args, **kwargs)
        finally:
            torch._C._jit_set_num_profiled_runs(previous)
            self._called = True


class _OptimizedForward:
    """The forward afterburner.optimize puts on a module (see the module's docstring). A deep copy
    or an unpickled copy of the module gets its own, built from the copy at its first call."""

    def __init__(self, module, precision, inference, channels_last, sample_input):
        self._module = weakref.ref(module)  # the module holds this: no reference cycle back
        self._settings = (precision, inference, channels_last, sample_input)
        self._fused = None

    def __reduce__(self):
        return type(self), (self._module(),) + self._settings

    def build(self):
        """Scripts and fuses the module (and freezes it for inference); raises what stops that."""
        module = self._module()
        _, inference, _, sample_input = self._settings
        self._script = _scripted(self.plain_module(), inference, sample_input)
        self._fused = _FusedCopy(self._script, module)
        self._weights = list(module.parameters()) + list(module.buffers())
        self._frozen, self._frozen_weights = None, None
        if inference:
            self._freeze()

    def plain_module(self):
        """The module with its own forward: the same parameters, buffers and submodules."""
        twin = copy.copy(self._module())
        for name in ("forward", "__prepare_scriptable__"):
            vars(twin).pop(name, None)
        return twin

    def __call__(self, *args, **kwargs):
        if self._fused is None:
            self.build()
        precision, inference, channels_last, _ = self._settings
        if inference and not self._module().training and not torch.is_grad_enabled():
            if self._frozen_weights != self._weight_versions():
                self._freeze()
            return self._frozen(*args, **kwargs)
        if channels_last:
            args = tuple(torch.ops.afterburner.channels_last(a) if isinstance(a, torch.Tensor) and a.dim() == 4
                         and a.is_floating_point() else a for a in args)
        if precision != "bf16" or torch.is_autocast_cpu_enabled():
            return self._fused(*args, **kwargs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = self._fused(*args, **kwargs)
        return _in_float32(output)

    def _weight_versions(self):
        # An inference tensor keeps no version counter; outside inference mode it cannot change.
        return [(None if t.is_inference() else t._version, t.data_ptr()) for t in self._weights]

    def _freeze(self):
        frozen, _ = torch.ops.afterburner.optimize_for_inference(self._script._c, self._settings[0])
        self._frozen = torch.jit._recursive.wrap_cpp_module(frozen)
        self._frozen_weights = self._weight_versions()
