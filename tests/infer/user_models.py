#!/usr/bin/python3
"""Models written the way users write them in Python, with Python's own outputs: the corpus the
differential tests (tests/infer/differential_test.cpp, tests/serve/differential_serve_test.cpp)
run through every path of afterburner.

Generate mode:
    /usr/bin/python3 tests/infer/user_models.py DIR
  For each model NAME below (default init right after torch.manual_seed(0), eval mode) it writes
    DIR/NAME.pt           torch.jit.script(model), or torch.jit.trace(model, inputs) under no_grad for *_traced,
                          or for *_flat torch.jit.script(model) with every parameter and buffer a
                          view of one storage (as a flat optimizer's buffer holds them, and as
                          `afterburner train --model` exports them)
    DIR/NAME_io.pt        a TorchScript module with no methods and float32/int64 buffers, for
                          every batch size B in 1, 2, 7, 64:
                            batchB_inputI   forward's I-th argument, B rows (the first B of 64)
                            batchB_outputJ  the J-th output (0 for a tensor, one per tuple
                                            element) of Python's forward at batch size B
                          and, for models whose inputs are floating point, five rows of the
                          batch-64 inputs holding NaN and infinities (non_finite_rows):
                            nonfinite_inputI, nonfinite_outputJ
    DIR/NAME_examples.pt  torch.save of the tuple of the batch-64 inputs, the file of example
                          inputs `afterburner optimize --example-inputs` reads
    DIR/models.txt        the names, one a line
  C++ reads the fixture as bench/export_reference.py's:
    auto io = torch::jit::load(dir + "/cnn_scripted_io.pt");
    auto x = io.attr("batch7_input0").toTensor(), expected = io.attr("batch7_output0").toTensor();

Run mode (Python runs a file afterburner wrote, e.g. a sketched model):
    /usr/bin/python3 tests/infer/user_models.py --run MODEL_PT IO_PT OUT_PT [MODEL_PT IO_PT OUT_PT ...]
  For each triple: torch.jit.load(MODEL_PT) runs on IO_PT's inputs at every batch size (under
  torch.no_grad, as loaded); OUT_PT gets the same inputs and these outputs, in the layout above.
"""

import sys
from pathlib import Path

import torch
from torch import nn

BATCH_SIZES = (1, 2, 7, 64)
SEED = 0


class Fixture(nn.Module):
    """Named tensors as buffers, so C++ reads them with torch::jit::load and Module::attr."""

    def __init__(self, tensors):
        super().__init__()
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor)


def issue_cnn():
    """The cnn of issue 10, exactly as its user wrote it."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def randomize_batch_norm(model):
    """Running statistics and affine parameters away from their 0/1 defaults, as after training:
    with the defaults a wrongly skipped or doubly applied BatchNorm would go unnoticed."""
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, (nn.BatchNorm1d, nn.BatchNorm2d)):
                layer.running_mean.uniform_(-0.5, 0.5)
                layer.running_var.uniform_(0.5, 2.0)
                layer.weight.uniform_(0.5, 1.5)
                layer.bias.uniform_(-0.2, 0.2)
                layer.num_batches_tracked.fill_(100)
    return model


class ResidualBlock(nn.Module):
    """A ResNet basic block: conv-BN-ReLU-conv-BN, plus the input, ReLU."""

    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + x)


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.block = ResidualBlock(16)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.block(torch.relu(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class Concat(nn.Module):
    """Two branches over the same input, concatenated along the features."""

    def __init__(self):
        super().__init__()
        self.wide = nn.Sequential(nn.Linear(24, 48), nn.ReLU())
        self.narrow = nn.Sequential(nn.Linear(24, 16), nn.Tanh())
        self.head = nn.Linear(64, 6)

    def forward(self, x):
        return self.head(torch.cat([self.wide(x), self.narrow(x)], dim=1))


class DenseTransition(nn.Module):
    """DenseNet's transition as its users write one (BatchNorm, ReLU, a 1x1 convolution without
    bias, average pooling), the pooling in ceil mode over an odd size, then a classifier."""

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm2d(16)
        self.conv = nn.Conv2d(16, 8, 1, bias=False)
        self.pool = nn.AvgPool2d(2, 2, ceil_mode=True)
        self.head = nn.Linear(8 * 5 * 5, 10)

    def forward(self, x):
        x = self.pool(self.conv(torch.relu(self.norm(x))))
        return self.head(torch.flatten(x, 1))


class TwoInputs(nn.Module):
    """An image and a feature vector, as a model with side information takes them."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.features = nn.Linear(8, 16)
        self.head = nn.Linear(8 * 6 * 6 + 16, 5)

    def forward(self, image, features):
        joined = torch.cat([self.conv(image), torch.relu(self.features(features))], dim=1)
        return self.head(joined)


class TwoOutputs(nn.Module):
    """Logits and the embedding they come from, returned as a tuple."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.classifier = nn.Linear(32, 7)

    def forward(self, x):
        embedding = self.body(x)
        return self.classifier(embedding), embedding


class EmbeddingBag(nn.Module):
    """Token ids in, mean of their embeddings, a linear classifier."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(50, 16)
        self.fc = nn.Linear(16, 4)

    def forward(self, tokens):
        return self.fc(self.embedding(tokens).mean(dim=1))


class SharedWeights(nn.Module):
    """Two Linear layers holding one weight Parameter (their biases differ)."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(32, 32)
        self.second = nn.Linear(32, 32)
        self.second.weight = self.first.weight
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(torch.relu(self.second(torch.relu(self.first(x)))))


class TokenAttention(nn.Module):
    """Tokens through a pre-norm transformer block as users write one: nn.MultiheadAttention
    (batch_first, so in evaluation PyTorch takes its fast path, aten::_native_multi_head_attention,
    asking for the weights by default, which the block drops), a residual, a GELU MLP, the first
    token (as ViT's class token) into a classifier of four classes."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.attention = nn.MultiheadAttention(16, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = self.norm(x)
        attended, _ = self.attention(h, h, h)
        x = x + attended
        return self.head((x + self.mlp(x))[:, 0])


class TokenEncoder(nn.Module):
    """Tokens through nn.TransformerEncoder of pre-norm GELU layers with dropout (batch_first: in
    evaluation each layer takes PyTorch's fast path, aten::_transformer_encoder_layer_fwd), the
    first token into a classifier of four classes."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.encoder(x)[:, 0])


def share_one_storage(model):
    """Every parameter and buffer of `model` re-pointed into one flat buffer, each at an offset
    rounded up to 16 elements; tied parameters stay tied. Saved, the file holds one storage."""
    tensors = list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]
    offsets, size = [], 0
    for tensor in tensors:
        offsets.append(size)
        size += (tensor.numel() + 15) // 16 * 16
    flat = torch.zeros(size)
    with torch.no_grad():
        for tensor, offset in zip(tensors, offsets):
            view = flat[offset:offset + tensor.numel()].view_as(tensor)
            view.copy_(tensor)
            tensor.data = view
    return model


def float_input(*shape):
    return lambda rows: torch.randn(rows, *shape)


def token_input(vocabulary, length):
    return lambda rows: torch.randint(0, vocabulary, (rows, length))


def corpus():
    """name -> (builder, [input maker per forward argument]); each is scripted, traced and
    scripted over one storage."""
    bn_dropout = lambda: randomize_batch_norm(nn.Sequential(  # noqa: E731
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.3), nn.Flatten(),
        nn.Linear(8 * 6 * 6, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 10)))
    return {
        "cnn": (issue_cnn, [float_input(1, 28, 28)]),
        "residual": (lambda: randomize_batch_norm(Residual()), [float_input(3, 12, 12)]),
        "concat": (Concat, [float_input(24)]),
        "dense_transition": (lambda: randomize_batch_norm(DenseTransition()), [float_input(16, 9, 9)]),
        "two_inputs": (TwoInputs, [float_input(1, 12, 12), float_input(8)]),
        "two_outputs": (TwoOutputs, [float_input(20)]),
        "bn_dropout": (bn_dropout, [float_input(3, 8, 8)]),
        "linear_no_bias": (lambda: nn.Sequential(nn.Linear(64, 128, bias=False), nn.ReLU(),
                                                 nn.Linear(128, 10, bias=False)), [float_input(64)]),
        "sequence": (lambda: nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)),
                     [float_input(5, 16)]),
        "embedding": (EmbeddingBag, [token_input(50, 6)]),
        "shared_weights": (SharedWeights, [float_input(32)]),
        "token_attention": (TokenAttention, [float_input(6, 16)]),
        "token_encoder": (TokenEncoder, [float_input(6, 16)]),
    }


def as_outputs(result):
    return list(result) if isinstance(result, tuple) else [result]


def non_finite_rows(inputs):
    """The first five rows of `inputs`, rows 0, 1 and 2 with a NaN, a +inf and a -inf in the first
    input, row 3 with a +inf in the last (for a model with two floating-point inputs), row 4 as it
    was; None if an input is not floating point (token ids)."""
    if not all(x.is_floating_point() for x in inputs):
        return None
    generator = torch.Generator().manual_seed(SEED + 1)
    rows = [x[:5].clone() for x in inputs]
    plants = [(0, 0, float("nan")), (1, 0, float("inf")), (2, 0, float("-inf"))]
    if len(rows) > 1:
        plants.append((3, len(rows) - 1, float("inf")))
    for row, argument, value in plants:
        sample = rows[argument][row].view(-1)
        sample[torch.randint(sample.numel(), (1,), generator=generator)] = value
    return rows


def fixture_tensors(model, inputs):
    """The layout above for `model` on `inputs` (batch-64 tensors, one per argument)."""
    tensors = {}
    with torch.no_grad():
        for batch in BATCH_SIZES:
            rows = [x[:batch].clone() for x in inputs]
            for i, x in enumerate(rows):
                tensors[f"batch{batch}_input{i}"] = x
            for j, y in enumerate(as_outputs(model(*rows))):
                tensors[f"batch{batch}_output{j}"] = y
        rows = non_finite_rows(inputs)
        if rows is not None:
            for i, x in enumerate(rows):
                tensors[f"nonfinite_input{i}"] = x
            for j, y in enumerate(as_outputs(model(*rows))):
                tensors[f"nonfinite_output{j}"] = y
    return tensors


def save_fixture(tensors, path):
    torch.jit.script(Fixture(tensors)).save(str(path))


def generate(out):
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for base, (build, makers) in corpus().items():
        for variant in ("scripted", "traced", "flat"):
            torch.manual_seed(SEED)
            model = build().eval()
            inputs = [make(max(BATCH_SIZES)) for make in makers]
            if variant == "scripted":
                compiled = torch.jit.script(model)
            elif variant == "flat":
                compiled = torch.jit.script(share_one_storage(model))
            else:
                # Under no_grad, as inference exports are traced: with grad on, MultiheadAttention's
                # trace (composed ops) differs from its check's run (no_grad: the fast path) and
                # torch.jit.trace refuses it.
                with torch.no_grad():
                    compiled = torch.jit.trace(model, tuple(x[:2] for x in inputs))
            name = f"{base}_{variant}"
            compiled.save(str(out / f"{name}.pt"))
            save_fixture(fixture_tensors(compiled, inputs), out / f"{name}_io.pt")
            torch.save(tuple(inputs), str(out / f"{name}_examples.pt"))
            names.append(name)
    (out / "models.txt").write_text("".join(name + "\n" for name in names))


def run(triples):
    for model_path, io_path, out_path in triples:
        model = torch.jit.load(model_path)
        io = torch.jit.load(io_path)
        inputs, count = [], 0
        while hasattr(io, f"batch64_input{count}"):
            inputs.append(getattr(io, f"batch64_input{count}"))
            count += 1
        save_fixture(fixture_tensors(model, inputs), out_path)


def main():
    args = sys.argv[1:]
    if len(args) == 1 and args[0] != "--run":
        generate(Path(args[0]))
    elif len(args) >= 4 and args[0] == "--run" and (len(args) - 1) % 3 == 0:
        run(zip(*[iter(args[1:])] * 3))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
