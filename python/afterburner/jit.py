"""TorchScript models fused: the patterns nn.fuse rewrites in a Sequential, found in any forward.

    from afterburner import jit
    scripted = torch.jit.script(model)                  # or torch.jit.trace(model, example)
    fused, report = jit.fuse(scripted)                  # a copy; `scripted` stays as it was
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)  # the same tensors train either
    print(report.fused)                                 # e.g. ['2 x relu + max_pool2d', ...]

fuse() inlines the submodules' forwards into the module's forward and rewrites relu then
max_pool2d, conv2d then relu (unless that relu goes to a max_pool2d) and linear then relu onto
afterburner's ops, wherever they sit: custom forwards, functional calls, in-place relus. Scripted
nn.MultiheadAttention (alone, or in nn.TransformerEncoderLayer, torchvision's ViT) runs its heads
through afterburner's fused attention, forward and backward, in float32 and under bf16 autocast
(where LibTorch 1.13's scripted module fails to evaluate); what the fused op does not compute as
MHA does (dropout on the weights while training, add_zero_attn, bias_k/bias_v, unbatched inputs)
runs MHA's own code, chosen as the forward runs. The copy
shares every parameter and buffer with the module given, keeps its train()/eval() behaviour
(BatchNorm, Dropout) and its state_dict keys; files it saves need afterburner's ops to load
(`import afterburner`, or afterburner's own tools). `afterburner train --model FILE` applies the
same rewrite to the files it trains.
"""
from typing import Tuple

import torch

from .nn import FuseReport

__all__ = ["fuse"]


def fuse(module: torch.jit.ScriptModule) -> Tuple[torch.jit.ScriptModule, FuseReport]:
    """(a fused copy of `module` sharing its parameters, what was fused and what was left)."""
    if not isinstance(module, torch.jit.ScriptModule):
        raise TypeError(f"afterburner.jit.fuse: expected a torch.jit.ScriptModule (script or trace the model first; "
                        f"afterburner.nn.fuse rewrites an nn.Module's Sequentials), got {type(module).__name__}")
    fused, done, notices = torch.ops.afterburner.fuse_script(module._c)
    return torch.jit._recursive.wrap_cpp_module(fused), FuseReport(list(done), list(notices))
