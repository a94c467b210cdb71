"""`afterburner sketch --attention-features M` on TorchScript files written by Python that hold
nn.MultiheadAttention (alone, sequence first, cross-attention, causal; in nn.TransformerEncoder;
torchvision's VisionTransformer): the sketched file, loaded by Python, against the same model in
double with each attention replaced by Panther's random-feature definition written out here, with
the projection the file holds. Forward in evaluation and training, gradients, masks, twice; and the
layers it must keep, with the reason."""
import copy
import json
import subprocess

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from typing import Optional

import afterburner  # noqa: F401  (the sketched files call afterburner's ops)
from image_models import RowsTransformer
from served import BINARY
from test_rand_attention import panther_features
from test_train_model_file import FASHION_MNIST, accuracy_of, fashion_mnist_subset

pytestmark = pytest.mark.skipif(not BINARY, reason="AFTERBURNER_BINARY is set by ctest")

FEATURES = 24


class ReferencePerformer(nn.Module):
    """Panther's random-feature attention in double with nn.MultiheadAttention's call: sequence
    first unless batch_first, key_padding_mask (true = ignored), an attn_mask that is the causal
    one makes it causal (running sums position by position, as Panther's causal path)."""

    def __init__(self, mha: nn.MultiheadAttention, projection: Tensor, kernel_fn: str):
        super().__init__()
        e = mha.embed_dim
        self.num_heads, self.batch_first, self.softmax = mha.num_heads, mha.batch_first, kernel_fn == "softmax"
        self._qkv_same_embed_dim = False  # TransformerEncoderLayer then takes its own path, not its fast one
        weight = mha.in_proj_weight.detach().double()
        bias = None if mha.in_proj_bias is None else mha.in_proj_bias.detach().double()
        for i, name in enumerate(("Wq", "Wk", "Wv")):
            setattr(self, name, nn.Parameter(weight[i * e:(i + 1) * e].clone()))
            setattr(self, "b" + name[1], None if bias is None else nn.Parameter(bias[i * e:(i + 1) * e].clone()))
        self.W0 = nn.Parameter(mha.out_proj.weight.detach().double().clone())
        self.b0 = None if mha.out_proj.bias is None else nn.Parameter(mha.out_proj.bias.detach().double().clone())
        self.register_buffer("projection", projection.double())

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True):
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        b, length, e = query.shape
        h = self.num_heads

        def heads(x, w, bias):
            return F.linear(x, w, bias).view(b, x.shape[1], h, e // h)

        qf = panther_features(heads(query, self.Wq, self.bq), self.projection, self.softmax, True)
        kf = panther_features(heads(key, self.Wk, self.bk), self.projection, self.softmax, False)
        v = heads(value, self.Wv, self.bv)
        if key_padding_mask is not None:
            kf = kf.masked_fill(key_padding_mask.view(b, -1, 1, 1), 0)
        causal = attn_mask is not None
        if causal:
            assert torch.equal(attn_mask.isneginf(), torch.ones(length, length, dtype=torch.bool).triu(1))
            rows, sums, key_sums = [], 0, 0
            for i in range(length):
                sums = sums + torch.einsum("bhm,bhd->bhmd", kf[:, i], v[:, i])
                key_sums = key_sums + kf[:, i]
                rows.append(torch.einsum("bhmd,bhm->bhd", sums, qf[:, i]) / (qf[:, i] * key_sums).sum(-1, True))
            attended = torch.stack(rows, 1)
        else:
            numerator = torch.einsum("blhm,bshm,bshd->blhd", qf, kf, v)
            attended = numerator / torch.einsum("blhm,bshm->blh", qf, kf).unsqueeze(-1)
        out = F.linear(attended.reshape(b, length, e), self.W0, self.b0)
        return (out if self.batch_first else out.transpose(0, 1)), None


class CausalSequenceFirst(nn.Module):
    """A decoder-only block as users write it: nn.MultiheadAttention sequence first under
    generate_square_subsequent_mask's float mask, the weights asked for and dropped. (LibTorch 1.13
    cannot script nn.MultiheadAttention without bias: no file holds one.)"""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2)
        self.norm = nn.LayerNorm(16)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(160))

    def forward(self, x):
        length = x.size(0)
        out, _ = self.attn(x, x, x, attn_mask=self.causal[:length, :length])
        return self.norm(x + out)


class CrossAttention(nn.Module):
    """Queries from one sequence, keys and values from another of other length, batch first, with
    the keys' padding mask."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(24, 4, batch_first=True)
        self.head = nn.Linear(24, 5)

    def forward(self, x, memory, padding: Optional[Tensor] = None):
        return self.head(self.attn(x, memory, memory, key_padding_mask=padding)[0])


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(32, 10)

    def forward(self, x, padding: Optional[Tensor] = None):
        return self.head(self.encoder(x, src_key_padding_mask=padding).mean(1))


class Pixels(nn.Module):
    """Fashion-MNIST as 784 one-pixel tokens through one encoder layer: a sequence long enough that
    random features run several times faster than exact attention (4-5x at m 16 and 32 here), so
    that the search's outcome does not hang on the machine's noise."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(1, 32)
        self.position = nn.Parameter(torch.randn(1, 784, 32) * 0.02)
        layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x.reshape(x.size(0), 784, 1)) + self.position).mean(1))


class ReadsTheWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x):
        out, weights = self.attn(x, x, x)
        assert weights is not None
        return out + weights.sum()


def vision_transformer():
    from torchvision.models import VisionTransformer
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64,
                              num_classes=10)
    nn.init.normal_(model.heads.head.weight)  # torchvision starts it at zero: every logit would be 0
    return model


def sketched(tmp_path, model, *arguments):
    """(model scripted and saved, sketched by the CLI and loaded, the CLI's stdout)."""
    torch.jit.script(model).save(str(tmp_path / "dense.pt"))
    done = subprocess.run([BINARY, "sketch", str(tmp_path / "dense.pt"), "-o", str(tmp_path / "sketched.pt"),
                           "--attention-features", str(FEATURES), *arguments], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return torch.jit.load(str(tmp_path / "sketched.pt")), done.stdout


def reference_of(model, file, kernel_fn="softmax"):
    """`model` in double, each nn.MultiheadAttention that `file` replaced by ReferencePerformer
    with the projection `file` holds at the same path (those it kept stay exact)."""
    reference = copy.deepcopy(model).double()
    buffers = dict(file.named_buffers())
    for name, module in list(reference.named_modules()):
        if isinstance(module, nn.MultiheadAttention) and name + ".projection_matrix" in buffers:
            parent_name, _, child = name.rpartition(".")
            parent = reference.get_submodule(parent_name)
            setattr(parent, child, ReferencePerformer(module, buffers[name + ".projection_matrix"], kernel_fn))
    return reference


def assert_close(got, expected):
    error = (got.double() - expected).abs().max() / expected.abs().max()
    assert error < 2e-5, f"relative error {error:.3g}"


def assert_same_twice(file, inputs, expected):
    with torch.no_grad():
        first = file(*inputs)
        assert_close(first, expected)
        assert torch.equal(file(*inputs), first)


@pytest.mark.parametrize("batch", [1, 3])
def test_encoder_with_padding_equals_the_definition(tmp_path, batch):
    torch.manual_seed(0)
    model = Encoder().eval()
    file, report = sketched(tmp_path, model)
    assert "encoder.layers.0.self_attn (MultiheadAttention, embed_dim 32, 4 heads): 24 random features" in report
    assert "encoder.layers.1.self_attn" in report and "2 of 7 layers sketched" in report
    assert set(dict(file.named_parameters())) - set(dict(model.named_parameters())) == {
        f"encoder.layers.{i}.self_attn.{n}" for i in range(2) for n in ("Wq", "Wk", "Wv", "W0", "bq", "bk", "bv", "b0")}
    reference = reference_of(model, file)
    x = torch.randn(batch, 37, 32)
    padding = torch.zeros(batch, 37, dtype=torch.bool)
    padding[-1, 30:] = True
    with torch.no_grad():
        assert_same_twice(file, (x,), reference(x.double()))
        assert_same_twice(file, (x, padding), reference(x.double(), padding))
        # Padding as a float mask (-inf ignored), as some users pass it.
        float_padding = torch.zeros(batch, 37).masked_fill(padding, float("-inf"))
        assert_close(file(x, float_padding), reference(x.double(), padding))


def test_the_encoder_layers_linear_layers_are_sketched_without_its_attention(tmp_path):
    torch.manual_seed(0)
    model = Encoder().eval()
    torch.jit.script(model).save(str(tmp_path / "dense.pt"))
    done = subprocess.run([BINARY, "sketch", str(tmp_path / "dense.pt"), "-o", str(tmp_path / "sketched.pt"), "--rank",
                           "8"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # TransformerEncoderLayer's fast path reads linear1.weight: removed, it no longer keeps linear1.
    assert "encoder.layers.0.linear1 (Linear [64, 32]): rank 8" in done.stdout
    assert "encoder.layers.0.self_attn (MultiheadAttention, embed_dim 32, 4 heads) kept: exact attention" in done.stdout
    file = torch.jit.load(str(tmp_path / "sketched.pt"))
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        first = file(x)
        assert torch.equal(file(x), first) and torch.isfinite(first).all()


def test_encoder_gradients_equal_autograds_through_the_definition(tmp_path):
    torch.manual_seed(1)
    model = Encoder().train()
    file, _ = sketched(tmp_path, model)
    file.train()
    reference = reference_of(model, file).train()
    x = torch.randn(4, 21, 32)
    file(x).square().sum().backward()
    reference(x.double()).square().sum().backward()
    expected = dict(reference.named_parameters())
    for name, parameter in file.named_parameters():
        assert parameter.grad is not None, name
        assert_close(parameter.grad, expected[name].grad)


@pytest.mark.parametrize("length", [1, 9, 131])  # 131: causal sums across blocks of 128
def test_causal_mask_makes_a_causal_sequence_first_attention(tmp_path, length):
    torch.manual_seed(2)
    model = CausalSequenceFirst().eval()
    file, _ = sketched(tmp_path, model, "--attention-kernel", "softmax")
    x = torch.randn(length, 2, 16)
    assert_same_twice(file, (x,), reference_of(model, file)(x.double()))


def test_cross_attention_with_relu_features(tmp_path):
    torch.manual_seed(3)
    model = CrossAttention().eval()
    file, _ = sketched(tmp_path, model, "--attention-kernel", "relu")
    assert file.attn.kernel_fn == "relu" and file.attn.projection_matrix.shape == (FEATURES, 6)
    x, memory = torch.randn(5, 7, 24), torch.randn(5, 11, 24)
    padding = torch.zeros(5, 11, dtype=torch.bool)
    padding[2, 4:] = True
    reference = reference_of(model, file, "relu")
    assert_same_twice(file, (x, memory, padding), reference(x.double(), memory.double(), padding))


def test_vision_transformer_from_torchvision(tmp_path):
    torch.manual_seed(4)
    model = vision_transformer().eval()
    file, report = sketched(tmp_path, model)
    assert report.count("random features per head") == 2
    images = torch.randn(2, 3, 32, 32)
    assert_same_twice(file, (images,), reference_of(model, file)(images.double()))


def test_attention_layers_of_their_own_number_of_features(tmp_path):
    torch.manual_seed(6)
    model = Encoder().eval()
    file, report = sketched(tmp_path, model, "--layers", "encoder.layers.0.self_attn=m:8")
    assert "encoder.layers.0.self_attn (MultiheadAttention, embed_dim 32, 4 heads): 8 random features per head" in report
    assert f"encoder.layers.1.self_attn (MultiheadAttention, embed_dim 32, 4 heads): {FEATURES} random features" in report
    buffers = dict(file.named_buffers())
    assert buffers["encoder.layers.0.self_attn.projection_matrix"].shape == (8, 8)
    assert buffers["encoder.layers.1.self_attn.projection_matrix"].shape == (FEATURES, 8)
    x = torch.randn(3, 11, 32)
    assert_same_twice(file, (x,), reference_of(model, file)(x.double()))
    # One of two layers of one TorchScript class kept: the other is kept too, and says why.
    torch.jit.script(model).save(str(tmp_path / "dense.pt"))
    done = run_sketch(tmp_path / "dense.pt", tmp_path / "kept.pt", "--layers", "encoder.layers.1.self_attn=keep")
    assert done.returncode == 1 and "no layer was sketched" in done.stderr
    assert "encoder.layers.0.self_attn (MultiheadAttention, embed_dim 32, 4 heads) kept: it shares its TorchScript " \
           "class with encoder.layers.1.self_attn, which is kept" in done.stdout
    assert "encoder.layers.1.self_attn (MultiheadAttention, embed_dim 32, 4 heads) kept: kept by the per-layer plan" \
           in done.stdout


def test_bf16_autocast_runs_the_sketched_file_close_to_fp32_and_trains(tmp_path):
    torch.manual_seed(4)
    file, _ = sketched(tmp_path, vision_transformer().eval())
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        exact = file(images)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            first, second = file(images), file(images)
    assert first.dtype == torch.bfloat16 and torch.equal(first, second)
    assert (first.float() - exact).abs().max() / exact.abs().max() < 3e-2  # bf16's 8 bits, features in fp32
    file.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        file(images).float().square().sum().backward()
    gradient = dict(file.named_parameters())["encoder.layers.encoder_layer_0.self_attention.Wq"].grad
    assert gradient is not None and torch.isfinite(gradient).all() and gradient.abs().sum() > 0


def test_linear_layers_are_sketched_beside_attention(tmp_path):
    torch.manual_seed(4)
    file, report = sketched(tmp_path, vision_transformer().eval(), "--rank", "8")
    assert "encoder.layers.encoder_layer_0.mlp.0 (Linear [64, 32]): rank 8" in report
    assert report.count("random features per head") == 2
    assert "encoder.layers.encoder_layer_0.mlp.0.S1s" in dict(file.named_parameters())


def test_masks_random_features_cannot_hold_are_one_error_naming_the_mask(tmp_path):
    torch.manual_seed(5)
    model = CrossAttention().eval()
    file, _ = sketched(tmp_path, model)
    x = torch.randn(2, 3, 24)
    bias = torch.zeros(2, 3)
    bias[0, 1] = -2.0  # an additive score bias, not a mask
    with pytest.raises(RuntimeError, match="key_padding_mask: holds values other than 0 and -inf"):
        file(x, x, bias)


def run_sketch(source, out, *arguments):
    return subprocess.run([BINARY, "sketch", str(source), "-o", str(out), "--attention-features", "8", *arguments],
                          capture_output=True, text=True)


def test_layers_it_cannot_replace_are_kept_with_the_reason(tmp_path):
    torch.jit.script(ReadsTheWeights()).save(str(tmp_path / "weights.pt"))
    done = run_sketch(tmp_path / "weights.pt", tmp_path / "out.pt")
    assert done.returncode == 1
    assert "attn (MultiheadAttention, embed_dim 16, 2 heads) kept: forward reads the attention weights" in done.stdout
    assert done.stderr.strip().endswith("no layer was sketched (1 Linear, Conv2d or MultiheadAttention layers found); "
                                        "nothing written")
    assert not (tmp_path / "out.pt").exists()

    x = torch.randn(2, 3, 24)
    torch.jit.trace(CrossAttention().eval(), (x, x)).save(str(tmp_path / "traced.pt"))
    done = run_sketch(tmp_path / "traced.pt", tmp_path / "out.pt")
    assert done.returncode == 1
    assert "attn (MultiheadAttention, embed_dim 24) kept: a forward of another signature (traced" in done.stdout


def test_a_sketched_file_goes_on_to_optimize_and_serves_as_python_runs_it(tmp_path):
    torch.manual_seed(6)
    file, _ = sketched(tmp_path, vision_transformer().eval())
    done = subprocess.run([BINARY, "optimize", str(tmp_path / "sketched.pt"), "-o", str(tmp_path / "optimized.pt"),
                           "--input-shape", "3,32,32", "--verify-seconds", "1", "--measure-seconds", "0"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr  # it verifies the runtime serve uses against the file
    optimized = torch.jit.load(str(tmp_path / "optimized.pt"))
    for batch in (1, 5):
        images = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            assert_close(optimized(images), file(images).double())


@pytest.mark.skipif(not FASHION_MNIST.exists(), reason="needs the dataset")
def test_a_sketched_transformer_trains_exports_and_optimizes_as_users_chain_them(tmp_path):
    torch.manual_seed(7)
    sketched(tmp_path, RowsTransformer())  # in training mode (its dropout on), as a model about to train
    run = subprocess.run([BINARY, "train", "--model", str(tmp_path / "sketched.pt"), "--max-steps", "150",
                          "--progress", "none", "--threads", "2", "--report", str(tmp_path / "report.json"),
                          "--export", str(tmp_path / "trained.pt")], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    accuracy = json.loads((tmp_path / "report.json").read_text())["test_accuracy"]
    assert accuracy > 0.6, accuracy
    trained = torch.jit.load(str(tmp_path / "trained.pt"))
    name = "encoder.layers.0.self_attn.Wq"
    assert not torch.equal(trained.state_dict()[name], torch.jit.load(str(tmp_path / "sketched.pt")).state_dict()[name])
    assert abs(accuracy_of(trained) - accuracy) < 0.005  # Python runs the model the report measured
    done = subprocess.run([BINARY, "optimize", str(tmp_path / "trained.pt"), "-o", str(tmp_path / "optimized.pt"),
                           "--verify-seconds", "1", "--measure-seconds", "0"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(not FASHION_MNIST.exists(), reason="needs the dataset")
def test_tune_searches_a_files_attention_and_writes_a_plan_train_takes(tmp_path):
    torch.manual_seed(8)
    torch.jit.script(Pixels()).save(str(tmp_path / "pixels.pt"))
    data = tmp_path / "data"
    fashion_mnist_subset(data, 1000, 200)
    out = tmp_path / "pixels-sketched.pt"
    done = subprocess.run([BINARY, "sketch", "--tune", "--model", str(tmp_path / "pixels.pt"), "--data", str(data),
                           "--epochs", "1", "--max-steps", "20", "--threads", "2", "--max-accuracy-drop", "0.9",
                           "--measure-seconds", "0.05", "--attention-features", "16,32", "--attention-kernel", "relu",
                           "-o", str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = done.stdout[done.stdout.index("\ndense"):].strip().splitlines()
    assert "chosen" in rows[1], done.stdout  # every plan reaches a target 0.9 below dense: the fastest wins
    names = [row[:16].strip() for row in rows[1:] if not row.startswith("note")]
    assert {"m 16", "m 32"} <= set(names) and "m 64" not in names, done.stdout  # attention alone, each m asked for
    assert any(name.startswith("L ") and " m " in name for name in names), done.stdout  # and with the Linear layers

    plan = (tmp_path / "pixels-sketched.plan.toml").read_text()
    initial = tmp_path / "pixels-sketched.plan.initial.pt"
    assert f"model = '{initial}'" in plan and "sketch = true" not in plan, plan
    chosen, trained = torch.jit.load(str(initial)), torch.jit.load(str(out))
    assert set(dict(chosen.named_parameters())) == set(dict(trained.named_parameters()))
    if " m " in f" {rows[1][:16]} ":  # the chosen plan replaced the attention, as asked
        attention = getattr(trained.encoder.layers, "0").self_attn
        assert attention.kernel_fn == "relu" and attention.projection_matrix.shape[0] in (16, 32)
    with torch.no_grad():
        logits = trained(torch.randn(3, 1, 28, 28))
    assert logits.shape == (3, 10) and torch.isfinite(logits).all()
    again = subprocess.run([BINARY, "train", "--config", str(tmp_path / "pixels-sketched.plan.toml"), "--data",
                            str(data), "--max-steps", "1", "--progress", "none"], capture_output=True, text=True,
                           timeout=900)
    assert again.returncode == 0, again.stderr

