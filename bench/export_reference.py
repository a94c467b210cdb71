#!/usr/bin/python3
"""TorchScript fixtures that let C++ tests prove interop with Python PyTorch, both ways.

Export mode: Python -> C++
    /usr/bin/python3 bench/export_reference.py --out DIR [--models cnn mlp] [--seed 0] [--batch 4]
  For each model (the same layers as bench/pytorch_train.py and afterburner's zoo, so
  parameter names are the zoo's "0.weight", "0.bias", "3.weight", ...; default init right
  after torch.manual_seed(seed), so a model's fixture does not depend on --models; eval mode)
  it writes
    DIR/<model>.pt     torch.jit.script(model), saved with torch.jit.save
    DIR/<model>_io.pt  a TorchScript module with no methods and two float32 buffers:
                       input  [batch, 1, 28, 28] from torch.randn (same seed)
                       output [batch, 10] = model(input)
  then loads both files back and runs the check below on them. C++ reads them with
    auto model = torch::jit::load(dir + "/cnn.pt");
    auto io = torch::jit::load(dir + "/cnn_io.pt");
    auto input = io.attr("input").toTensor(), expected = io.attr("output").toTensor();
  Exit 0 when everything was written and checked, 1 if a loaded model disagrees.

Check mode: C++ -> Python
    /usr/bin/python3 bench/export_reference.py --check MODEL_PT IO_PT [--tolerance 1e-5]
  Loads MODEL_PT (e.g. exported by afterburner) with torch.jit.load, runs its forward on
  IO_PT's `input` as saved (no train/eval switch, under torch.inference_mode) and compares with
  IO_PT's `output`. IO_PT has the layout above; from C++:
    torch::jit::Module io("Fixture");
    io.register_buffer("input", input);
    io.register_buffer("output", output);
    io.save(path);
  Prints one line "max abs diff D (tolerance T): match|MISMATCH", or the reason it could not
  compare. Exit 0 if the max abs difference is <= tolerance, 1 if it is larger, not finite, or
  the shapes differ, 2 if a file cannot be loaded or lacks `input`/`output` (and for bad usage).
"""

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

from pytorch_train import MODEL_NAMES, build_model, positive_int

EXIT_MATCH, EXIT_MISMATCH, EXIT_UNUSABLE = 0, 1, 2
IMAGE_SHAPE = (1, 28, 28)


class Fixture(nn.Module):
    """Holds a reference input and its expected output as buffers, so C++ reads them with
    torch::jit::load and Module::attr, without unpickling Python objects."""

    def __init__(self, reference_input, expected_output):
        super().__init__()
        self.register_buffer("input", reference_input)
        self.register_buffer("output", expected_output)


class UnusableFile(Exception):
    """A file that cannot serve the comparison; the message names it."""


def load_script(path):
    try:
        return torch.jit.load(str(path))
    except (RuntimeError, ValueError, OSError) as e:
        raise UnusableFile(f"{path}: cannot load as TorchScript ({str(e).splitlines()[0]})")


def tensor_attr(module, name, path):
    if not module._c.hasattr(name) or not isinstance(getattr(module, name), torch.Tensor):
        raise UnusableFile(f"{path}: no tensor attribute '{name}'")
    return getattr(module, name)


def max_abs_diff(model_path, io_path):
    """max |model(input) - output|, or None after printing why the shapes cannot compare."""
    model = load_script(model_path)
    io = load_script(io_path)
    reference_input = tensor_attr(io, "input", io_path)
    expected = tensor_attr(io, "output", io_path)
    with torch.inference_mode():
        actual = model(reference_input)
    if not isinstance(actual, torch.Tensor):
        print(f"{model_path}: forward returned {type(actual).__name__}, not a tensor")
        return None
    if actual.shape != expected.shape:
        print(f"{model_path}: output shape {list(actual.shape)}, "
              f"{io_path} expects {list(expected.shape)}")
        return None
    return (actual.float() - expected.float()).abs().max().item()


def check(model_path, io_path, tolerance):
    """Exit code of the comparison, after printing its one-line verdict."""
    try:
        diff = max_abs_diff(model_path, io_path)
    except UnusableFile as e:
        print(e)
        return EXIT_UNUSABLE
    if diff is None:
        return EXIT_MISMATCH
    matches = diff <= tolerance  # False for NaN, as it should be
    print(f"max abs diff {diff:.3g} (tolerance {tolerance:g}): {'match' if matches else 'MISMATCH'}")
    return EXIT_MATCH if matches else EXIT_MISMATCH


def export(name, out_dir, seed, batch):
    """Writes <name>.pt and <name>_io.pt; returns their paths."""
    torch.manual_seed(seed)
    model = torch.jit.script(build_model(name).eval())
    reference_input = torch.randn(batch, *IMAGE_SHAPE)
    with torch.inference_mode():
        expected_output = model(reference_input)
    model_path, io_path = out_dir / f"{name}.pt", out_dir / f"{name}_io.pt"
    model.save(str(model_path))
    torch.jit.script(Fixture(reference_input, expected_output)).save(str(io_path))
    return model_path, io_path


def export_all(args):
    args.out.mkdir(parents=True, exist_ok=True)
    worst = EXIT_MATCH
    for name in args.models:
        model_path, io_path = export(name, args.out, args.seed, args.batch)
        print(f"{name}: wrote {model_path} and {io_path}; loaded back: ", end="")
        worst = max(worst, check(model_path, io_path, args.tolerance))
    return worst


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="See the top of this file for the file layouts and the exit codes.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", type=Path, metavar="DIR", help="export the fixtures into DIR")
    mode.add_argument("--check", nargs=2, type=Path, metavar=("MODEL_PT", "IO_PT"),
                      help="run MODEL_PT on IO_PT's input and compare with its output")
    p.add_argument("--models", nargs="+", choices=MODEL_NAMES, default=list(MODEL_NAMES),
                   help="models to export")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed before each model")
    p.add_argument("--batch", type=positive_int, default=4, help="rows of the reference input")
    p.add_argument("--tolerance", type=float, default=1e-5, help="max abs difference allowed")
    return p.parse_args(argv)


def main():
    args = parse_args()
    sys.exit(check(*args.check, args.tolerance) if args.check else export_all(args))


if __name__ == "__main__":
    main()
