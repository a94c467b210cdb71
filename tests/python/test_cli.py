"""A model written in Python with a sketched layer, fused with afterburner.nn.fuse and saved by
torch.jit.save, runs in afterburner's C++ tools: `afterburner optimize` rewrites and verifies it,
`afterburner serve` answers requests with it, and both agree with the Python model."""
import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
import torch

from afterburner import nn as abnn

BINARY = os.environ.get("AFTERBURNER_BINARY", "")
pytestmark = pytest.mark.skipif(not BINARY, reason="AFTERBURNER_BINARY is set by ctest")

SOURCE_DIR = Path(os.environ.get("AFTERBURNER_SOURCE_DIR", Path(__file__).resolve().parents[2]))


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


def infer(port, x):
    body = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.flatten().tolist()}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/cnn/infer", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        output = json.load(reply)["outputs"][0]
    return torch.tensor(output["data"]).view(output["shape"])


def test_serve_answers_as_the_python_model(fused_cnn, tmp_path):
    model, path = fused_cnn
    (tmp_path / "cnn").mkdir()
    (tmp_path / "cnn" / "model.pt").write_bytes(path.read_bytes())
    (tmp_path / "cnn" / "config.toml").write_text(readme_config())  # max_batch_size 64
    server = subprocess.Popen([BINARY, "serve", "--repo", str(tmp_path), "--port", "0"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in server.stdout:
            match = re.search(r"serving .* on http://127\.0\.0\.1:(\d+)", line)
            if match:
                port = int(match.group(1))
                break
        assert port, f"the server did not start: {server.stderr.read() if server.poll() is not None else ''}"
        with torch.no_grad():
            for batch in (1, 2, 7, 64):
                x = torch.randn(batch, 1, 28, 28)
                expected = model(x)
                for _ in range(2):
                    torch.testing.assert_close(infer(port, x), expected, rtol=1e-5, atol=1e-5)
    finally:
        server.terminate()
        server.wait(timeout=30)
