"""The package under test is build/python (PYTHONPATH, set by ctest), with Debian's torch."""
import torch

torch.manual_seed(0)
