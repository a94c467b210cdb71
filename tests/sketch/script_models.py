#!/usr/bin/python3
"""TorchScript models written by Python for the tests of `sketch_script` and `afterburner sketch`.

    /usr/bin/python3 tests/sketch/script_models.py DIR

writes DIR/<name>.pt (torch.jit.script, or torch.jit.trace where said; eval mode) and DIR/<name>_io.pt (buffers `input` and
`output` = model(input), the layout bench/export_reference.py --check reads) for:
  blocks  two instances of one Block class (Linear 64x64 + ReLU) and a Sequential head
          Linear(64, 32) - ReLU - Linear(32, 10, bias=False); input [4, 64]
  convs   Conv2d(3, 16, 3, padding=1) - ReLU - Conv2d(16, 32, 5, stride=2, padding=2) - ReLU -
          Conv2d(32, 32, 3, padding=1, groups=4); input [2, 3, 12, 12]
  peeks   a Linear whose weight the parent's forward also reads; input [4, 64]
  nested  a residual block (Linear main path, a Sequential holding a Linear as its shortcut, as a
          ResNet's projection) and a Linear head: a layer two modules down; input [4, 64]
  traced  torch.jit.trace of Conv2d(1, 16, 3, stride=2, padding=1) - ReLU - Flatten -
          Linear(16 * 14 * 14, 64); input [2, 1, 28, 28]
"""

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from export_reference import Fixture  # noqa: E402


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Block(64)
        self.b = Block(64)
        self.head = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10, bias=False))

    def forward(self, x):
        return self.head(self.b(self.a(x)))


class Peeks(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        return self.fc(x) + self.fc.weight.sum()


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Linear(64, 64)
        self.shortcut = nn.Sequential(nn.Linear(64, 64))

    def forward(self, x):
        return torch.relu(self.main(x) + self.shortcut(x))


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Residual()
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.block(x))


def models():
    convs = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 5, stride=2, padding=2),
                          nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1, groups=4))
    traced = nn.Sequential(nn.Conv2d(1, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 14 * 14, 64))
    return {"blocks": (Blocks(), [4, 64], False), "convs": (convs, [2, 3, 12, 12], False),
            "peeks": (Peeks(), [4, 64], False), "traced": (traced, [2, 1, 28, 28], True),
            "nested": (Nested(), [4, 64], False)}


def main():
    out = Path(sys.argv[1])
    torch.manual_seed(0)
    for name, (model, shape, trace) in models().items():
        x = torch.randn(shape)
        scripted = torch.jit.trace(model.eval(), x) if trace else torch.jit.script(model.eval())
        scripted.save(str(out / f"{name}.pt"))
        with torch.no_grad():
            torch.jit.script(Fixture(x, scripted(x))).save(str(out / f"{name}_io.pt"))


if __name__ == "__main__":
    main()
