"""afterburner from Python: one call that makes your model fast, and the fused ops, layers,
optimizers and loader it is made of.

    import torch, afterburner

    model = MyNet()                                     # any nn.Module taking [N, 1, 28, 28]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = afterburner.optimize(model, optimizer, dtype=torch.bfloat16)
    images, labels = afterburner.data.load_mnist("/usr/share/datasets/fashion-mnist", "train")
    loader = afterburner.data.Loader(images, labels, batch_size=128, scale=1 / 255, mean=[0.286], std=[0.353])
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(); loss.backward(); optimizer.step()
    served = afterburner.optimize(model.eval())                      # frozen for inference

The ops live in the dispatcher as torch.ops.afterburner.<name> (eager, torch.jit.script,
torch.jit.trace, and TorchScript files loaded by the `afterburner` command alike), the loader
as torch.classes.afterburner.Loader; the modules here are thin wrappers over them.
afterburner.optimize (frontend.py) scripts the model and runs afterburner.jit.fuse's rewrite of
it; afterburner.nn.fuse does the same for Sequentials in place, without TorchScript.
"""
import os as _os

import torch as _torch

_torch.ops.load_library(_os.path.join(_os.path.dirname(__file__), "libafterburner_ops.so"))

from . import data, heap, jit, linalg, nn, optim  # noqa: E402  (the ops must be loaded first)
from .frontend import optimize  # noqa: E402

__all__ = ["data", "heap", "jit", "linalg", "nn", "optim", "optimize"]
