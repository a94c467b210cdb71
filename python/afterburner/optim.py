"""torch.optim.SGD and AdamW stepped in one fused pass over all parameters of a group.

    from afterburner.optim import FlatSGD
    optimizer = FlatSGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=1000)
    ...
    optimizer.step()                              # one op call per group, parallel over chunks

Both are torch.optim.Optimizer subclasses with torch's arguments, param groups and state
(`momentum_buffer`; `step`, `exp_avg`, `exp_avg_sq`): their state_dicts load into torch's SGD and
AdamW and back, and LR schedulers drive them. Each parameter keeps its own storage, so
`module.to()` and state_dict work as with torch's optimizers; the update reads and writes every
element once (torch's per-parameter loop makes several passes). Parameters must be float32 CPU
tensors (for bf16 training keep fp32 weights and use autocast); gradients must be dense.
"""
import torch
from torch.optim.optimizer import Optimizer, required

__all__ = ["FlatSGD", "FlatAdamW"]


def _gradients(group, name):
    """The group's parameters that have a gradient, and those gradients."""
    params, grads = [], []
    for p in group["params"]:
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            raise RuntimeError(f"{name} does not support sparse gradients")
        params.append(p)
        grads.append(p.grad)
    return params, grads


def _laid_out_like(state, key, p):
    """state[key], re-laid out as `p` if `p` changed layout since (module.to(memory_format=...))."""
    tensor = state[key]
    if tensor.stride() != p.stride():
        tensor = state[key] = torch.empty_like(p, memory_format=torch.preserve_format).copy_(tensor)
    return tensor


def _unsupported(name, **flags):
    for flag, value in flags.items():
        if value:
            raise ValueError(f"{name}: {flag}=True is not supported; use torch.optim for it")


class _FusedStep(Optimizer):
    """torch.optim.Optimizer's step(closure) protocol around one fused op call per group."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads = _gradients(group, type(self).__name__)
            if params:
                self._step_group(group, params, grads)
        return loss


class FlatSGD(_FusedStep):
    """torch.optim.SGD's arguments and results (maximize, foreach and differentiable unsupported)."""

    def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False):
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        _unsupported("FlatSGD", maximize=maximize, differentiable=differentiable)
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                        maximize=maximize, foreach=foreach, differentiable=differentiable)
        super().__init__(params, defaults)

    def _step_group(self, group, params, grads):
        buffers, fresh = [], []
        if group["momentum"] != 0:
            for p in params:
                state = self.state[p]
                if state.get("momentum_buffer") is None:  # torch's first step fills it with the update
                    state["momentum_buffer"] = torch.empty_like(p, memory_format=torch.preserve_format)
                    fresh.append(True)
                else:
                    fresh.append(False)
                buffers.append(_laid_out_like(state, "momentum_buffer", p))
        torch.ops.afterburner.sgd_step_(params, grads, buffers, fresh, group["lr"], group["momentum"],
                                        group["dampening"], group["weight_decay"], group["nesterov"])


class FlatAdamW(_FusedStep):
    """torch.optim.AdamW's arguments and results (amsgrad, maximize, foreach, capturable unsupported)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameters: {betas}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        _unsupported("FlatAdamW", amsgrad=amsgrad, maximize=maximize, capturable=capturable)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                        foreach=foreach, capturable=capturable)
        super().__init__(params, defaults)

    def _step_group(self, group, params, grads):
        exp_avgs, exp_avg_sqs, steps = [], [], []
        for p in params:
            state = self.state[p]
            if not state:  # as torch initialises it
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            steps.append(int(state["step"].item()))
            exp_avgs.append(_laid_out_like(state, "exp_avg", p))
            exp_avg_sqs.append(_laid_out_like(state, "exp_avg_sq", p))
        beta1, beta2 = group["betas"]
        torch.ops.afterburner.adamw_step_(params, grads, exp_avgs, exp_avg_sqs, steps, group["lr"], beta1, beta2,
                                          group["eps"], group["weight_decay"])
