"""A model written in Python with a sketched layer, fused with afterburner.nn.fuse and saved by
torch.jit.save, runs in afterburner's C++ tools: `afterburner optimize` rewrites and verifies it,
`afterburner serve` answers requests with it (also the README's binary tensor example), and both
agree with the Python model."""
import contextlib
import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from afterburner import nn as abnn
from served import BINARY, infer_json, running_server

pytestmark = pytest.mark.skipif(not BINARY, reason="AFTERBURNER_BINARY is set by ctest")

SOURCE_DIR = Path(os.environ.get("AFTERBURNER_SOURCE_DIR", Path(__file__).resolve().parents[2]))
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def readme_config():
    """The model repository's config.toml exactly as the README tells users to write it."""
    readme = (SOURCE_DIR / "README.md").read_text()
    match = re.search(r"cat > models/cnn/config.toml <<'TOML'\n(.*?)\nTOML\n", readme, re.S)
    assert match, "README.md no longer shows the cnn's config.toml"
    return match.group(1) + "\n"


@pytest.fixture(scope="module")
def fused_cnn(tmp_path_factory):
    """The cnn as a user writes it, its second convolution sketched, fused, scripted and saved:
    (eager model, file)."""
    torch.manual_seed(7)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        abnn.SKConv2d(32, 64, 3, padding=1, num_terms=1, low_rank=16), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(3136, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    assert len(abnn.fuse(model).fused) == 3
    model.eval()
    scripted = torch.jit.script(model)
    graph = str(scripted.inlined_graph)
    assert "afterburner::relu_max_pool2d" in graph and "afterburner::skconv2d" in graph
    path = tmp_path_factory.mktemp("model") / "fused_cnn.pt"
    scripted.save(str(path))
    return model, path


def test_optimize_loads_verifies_and_rewrites_it(fused_cnn, tmp_path):
    model, path = fused_cnn
    out = tmp_path / "optimized.pt"
    run = subprocess.run([BINARY, "optimize", str(path), "-o", str(out), "--input-shape", "1,28,28",
                          "--measure-seconds", "0"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    optimized = torch.jit.load(str(out))
    with torch.no_grad():
        for batch in (1, 7, 64):
            x = torch.randn(batch, 1, 28, 28)
            for _ in range(2):
                torch.testing.assert_close(optimized(x), model(x), rtol=1e-4, atol=1e-4)


@contextlib.contextmanager
def served_cnn(path, repo):
    """`afterburner serve` of the model file as models/cnn with the README's config: its port."""
    (repo / "cnn").mkdir()
    (repo / "cnn" / "model.pt").write_bytes(path.read_bytes())
    (repo / "cnn" / "config.toml").write_text(readme_config())  # max_batch_size 64
    with running_server(repo) as port:
        yield port


def test_serve_answers_as_the_python_model(fused_cnn, tmp_path):
    model, path = fused_cnn
    with served_cnn(path, tmp_path) as port, torch.no_grad():
        for batch in (1, 2, 7, 64):
            x = torch.randn(batch, 1, 28, 28)
            expected = model(x)
            for _ in range(2):
                torch.testing.assert_close(infer_json(port, "cnn", x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not FASHION_MNIST.exists(), reason="needs the dataset")
def test_the_readme_binary_example_gets_the_models_answer(fused_cnn, tmp_path):
    """The README's binary tensor extension example, run as printed against the server, gets the
    model's logits for the normalised first test image."""
    model, path = fused_cnn
    readme = (SOURCE_DIR / "README.md").read_text()
    section = readme[readme.index("## Optimize and serve"):readme.index("## Sketch")]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    with gzip.open(FASHION_MNIST / "t10k-images-idx3-ubyte.gz") as f:
        pixels = torch.frombuffer(bytearray(f.read(16 + 784)[16:]), dtype=torch.uint8)
    image = ((pixels.float() / 255 - 0.2860) / 0.3530).view(1, 1, 28, 28)
    with torch.no_grad():
        expected = model(image)[0]
    with served_cnn(path, tmp_path) as port:
        run = subprocess.run([sys.executable, "-c", example.replace("127.0.0.1:8000", f"127.0.0.1:{port}") +
                              "print(json.dumps(logits))\n"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    printed_class, logits = run.stdout.splitlines()
    torch.testing.assert_close(torch.tensor(json.loads(logits)), expected, rtol=1e-5, atol=1e-5)
    assert printed_class == f"class {int(expected.argmax())}"
