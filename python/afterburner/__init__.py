"""afterburner from Python: its fused ops, layers, optimizers and loader for your own models.

    import torch, afterburner
    from afterburner import data, nn as abnn, optim

    images, labels = data.load_mnist("/usr/share/datasets/fashion-mnist", "train")
    loader = data.Loader(images, labels, batch_size=128, scale=1 / 255, mean=[0.286], std=[0.353])
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                torch.nn.Linear(32 * 14 * 14, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    abnn.fuse(model)                                    # same parameters, fused layers
    optimizer = optim.FlatSGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in loader:
        loss = abnn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(); loss.backward(); optimizer.step()

The ops live in the dispatcher as torch.ops.afterburner.<name> (eager, torch.jit.script,
torch.jit.trace, and TorchScript files loaded by the `afterburner` command alike), the loader
as torch.classes.afterburner.Loader; the modules here are thin wrappers over them.
afterburner.jit.fuse does for a scripted or traced model what afterburner.nn.fuse does for
Sequentials.
"""
import os as _os

import torch as _torch

_torch.ops.load_library(_os.path.join(_os.path.dirname(__file__), "libafterburner_ops.so"))

from . import data, heap, jit, nn, optim  # noqa: E402  (the ops must be loaded first)

__all__ = ["data", "heap", "jit", "nn", "optim"]
