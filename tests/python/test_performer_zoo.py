"""The zoo's performer (random-feature attention) through the chain users run: `afterburner train
--model performer --export` writes a TorchScript file whose answers equal the same network written
out in Python in double (Panther's attention definition, test_rand_attention.panther_forward) at
batch 1, 7 and 64, twice; Python's torch.jit.load runs it after `import afterburner`; and
`afterburner serve` answers as the file does."""
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import afterburner  # noqa: F401  (registers the ops the file calls)
from served import BINARY, classifier_config, infer_json, running_server
from test_rand_attention import panther_forward

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
pytestmark = [pytest.mark.skipif(not BINARY, reason="AFTERBURNER_BINARY is set by ctest"),
              pytest.mark.skipif(not FASHION_MNIST.exists(), reason="needs the dataset")]


@pytest.fixture(scope="module")
def performer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("performer") / "performer.pt"
    run = subprocess.run([BINARY, "train", "--model", "performer", "--max-steps", "30", "--epochs", "1",
                          "--progress", "none", "--export", str(path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return path


def double(t):
    return None if t is None else t.double()


def linear(x, layer):
    return F.linear(x, double(layer.weight), double(layer.bias))


def layer_norm(x, layer):
    return F.layer_norm(x, [x.shape[-1]], double(layer.weight), double(layer.bias))


def reference(model, images):
    """The performer's forward written out in double from the file's own tensors."""
    x = images.double().permute(0, 2, 1, 3).flatten(2)
    x = linear(x, model.layer1) + double(model.layer2.position)
    for block in (model.layer3, model.layer4):
        normed = layer_norm(x, block.ln1)
        x = x + panther_forward(block.attention, normed, normed, normed)
        x = x + linear(F.gelu(linear(layer_norm(x, block.ln2), block.fc1)), block.fc2)
    return linear(layer_norm(x, model.layer5).mean(1), model.layer7)


def test_the_exported_performer_equals_its_definition_in_double(performer_file):
    model = torch.jit.load(str(performer_file))
    assert model.layer3.attention.num_heads == 4 and model.layer3.attention.projection_matrix.shape == (32, 16)
    with torch.no_grad():
        for batch in (1, 7, 64):
            images = torch.randn(batch, 1, 28, 28)
            expected = reference(model, images)
            for _ in range(2):
                torch.testing.assert_close(model(images).double(), expected, rtol=1e-4, atol=1e-4)


def test_serve_answers_as_the_exported_performer(performer_file, tmp_path):
    model = torch.jit.load(str(performer_file))
    (tmp_path / "performer").mkdir()
    (tmp_path / "performer" / "model.pt").write_bytes(performer_file.read_bytes())
    (tmp_path / "performer" / "config.toml").write_text(classifier_config(64))
    with running_server(tmp_path) as port, torch.no_grad():
        for batch in (1, 2, 7):
            images = torch.randn(batch, 1, 28, 28)
            for _ in range(2):
                torch.testing.assert_close(infer_json(port, "performer", images), model(images), rtol=1e-5, atol=1e-5)
