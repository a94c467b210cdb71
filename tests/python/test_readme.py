"""The README's Python example runs as printed (one epoch of Fashion-MNIST) and leaves a model
file that `afterburner` can load; the normalisation it tells served models' clients is the
training set's."""
import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import afterburner

SOURCE_DIR = Path(os.environ.get("AFTERBURNER_SOURCE_DIR", Path(__file__).resolve().parents[2]))


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="needs the dataset")
def test_the_readme_example_trains_and_saves(tmp_path):
    readme = (SOURCE_DIR / "README.md").read_text()
    section = readme[readme.index("## From Python"):]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    package_parent = str(Path(afterburner.__file__).resolve().parents[1])  # the package under test
    run = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": package_parent})
    assert run.returncode == 0, run.stderr
    model = torch.jit.load(str(tmp_path / "model.pt"))
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="needs the dataset")
def test_the_readme_normalisation_is_the_training_sets():
    """`afterburner train` normalises by the training set's pixel mean and standard deviation (of
    pixel / 255); the README gives clients of a served model both to four decimals."""
    with gzip.open("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz") as f:
        pixels = torch.frombuffer(bytearray(f.read()[16:]), dtype=torch.uint8).double() / 255
    readme = (SOURCE_DIR / "README.md").read_text()
    given = re.findall(r"\(p(?:ixel)? / 255 - ([0-9.]+)\) / ([0-9.]+)", readme)
    assert len(given) >= 2, "the serve section's formula and its example"
    for mean, std in given:
        assert (mean, std) == (f"{pixels.mean():.4f}", f"{pixels.std():.4f}")
