"""afterburner from Python: its fused training ops and layers for your own torch.nn.Module.

    import torch, afterburner
    from afterburner import nn as abnn

    model = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                torch.nn.Linear(32 * 14 * 14, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    abnn.fuse(model)                                    # same parameters, fused layers
    loss = abnn.functional.cross_entropy(model(images), labels)
    loss.backward()

The ops live in the dispatcher as torch.ops.afterburner.<name> (eager, torch.jit.script,
torch.jit.trace, and TorchScript files loaded by the `afterburner` command alike); the modules
here are thin wrappers over them.
"""
import os as _os

import torch as _torch

_torch.ops.load_library(_os.path.join(_os.path.dirname(__file__), "libafterburner_ops.so"))

from . import heap, nn, optim  # noqa: E402  (the ops must be loaded first)

__all__ = ["heap", "nn", "optim"]
