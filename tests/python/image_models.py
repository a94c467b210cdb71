"""Image classifiers as users write them in Python, for Fashion-MNIST's [N, 1, 28, 28] images and
10 classes: the differential corpus's designs (tests/infer/user_models.py) with an image input,
the model of issue 25, and torchvision's architectures with a one-channel stem. Each builder
returns a fresh model with PyTorch's default initialisation from the global generator."""
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torchvision.models.convnext import CNBlockConfig


def issue_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


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
        return torch.relu(self.bn2(self.conv2(out)) + x)


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, padding=1)
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
        self.wide = nn.Sequential(nn.Flatten(), nn.Linear(784, 48), nn.ReLU())
        self.narrow = nn.Sequential(nn.Flatten(), nn.Linear(784, 16), nn.Tanh())
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(torch.cat([self.wide(x), self.narrow(x)], dim=1))


class Rows(nn.Module):
    """The image's rows as a sequence of 28 tokens through a GELU MLP, then a classifier."""

    def __init__(self):
        super().__init__()
        self.tokens = nn.Sequential(nn.Linear(28, 32), nn.GELU(), nn.Linear(32, 8))
        self.head = nn.Linear(28 * 8, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.tokens(x.squeeze(1)), 1))


class SharedWeights(nn.Module):
    """Two Linear layers holding one weight Parameter (their biases differ)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(784, 32)
        self.first = nn.Linear(32, 32)
        self.second = nn.Linear(32, 32)
        self.second.weight = self.first.weight
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.embed(torch.flatten(x, 1)))
        return self.head(torch.relu(self.second(torch.relu(self.first(x)))))


class ResidualAttention(nn.Module):
    """The model of issue 25: BatchNorm, a residual block with SiLU, a strided convolution into
    tokens, LayerNorm, multi-head attention and a GELU head with Dropout."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.conv = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.block_bn = nn.BatchNorm2d(16)
        self.proj = nn.Conv2d(16, 32, 2, stride=2)
        self.norm = nn.LayerNorm(32)
        self.attention = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 10))

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = F.silu(self.block_bn(self.conv(x)) + x)
        tokens = self.norm(self.proj(x).flatten(2).transpose(1, 2))
        attended, _ = self.attention(tokens, tokens, tokens)
        return self.head((tokens + attended).mean(1))


class RowsTransformer(nn.Module):
    """The image's rows as 28 tokens through nn.TransformerEncoder (post-norm layers, dropout,
    batch_first), mean-pooled into a classifier."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(28, 32)
        layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x.squeeze(1))).mean(1))


def bn_dropout():
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, stride=2), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.3), nn.Flatten(),
        nn.Linear(8 * 13 * 13, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 10))


def linear_no_bias():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128, bias=False), nn.ReLU(), nn.Linear(128, 10, bias=False))


def one_channel(conv):
    """`conv` with one input channel, its other options kept: torchvision's stems take RGB."""
    return nn.Conv2d(1, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, bias=conv.bias is not None)


def resnet18():
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = one_channel(model.conv1)
    return model


def mobilenet_v3_small():
    model = torchvision.models.mobilenet_v3_small(num_classes=10)
    model.features[0][0] = one_channel(model.features[0][0])
    return model


def efficientnet_b0():
    model = torchvision.models.efficientnet_b0(num_classes=10)
    model.features[0][0] = one_channel(model.features[0][0])
    return model


def convnext():
    """ConvNeXt's blocks (depthwise 7x7, LayerNorm, GELU, layer scale) in two small stages: 28
    pixels go 7, then 3, through its stem and downsampling."""
    model = torchvision.models.convnext.ConvNeXt([CNBlockConfig(32, 64, 2), CNBlockConfig(64, None, 2)],
                                                 stochastic_depth_prob=0.1, num_classes=10)
    model.features[0][0] = one_channel(model.features[0][0])
    return model


def vision_transformer():
    model = torchvision.models.VisionTransformer(image_size=28, patch_size=7, num_layers=2, num_heads=4,
                                                 hidden_dim=32, mlp_dim=64, num_classes=10)
    model.conv_proj = one_channel(model.conv_proj)
    return model


# name -> (builder, how it is compiled: "script" or "trace")
MODELS = {
    "cnn_scripted": (issue_cnn, "script"),
    "cnn_traced": (issue_cnn, "trace"),
    "residual": (Residual, "script"),
    "bn_dropout": (bn_dropout, "script"),
    "bn_dropout_traced": (bn_dropout, "trace"),
    "linear_no_bias": (linear_no_bias, "script"),
    "concat": (Concat, "script"),
    "rows_gelu": (Rows, "script"),
    "shared_weights": (SharedWeights, "script"),
    "residual_attention": (ResidualAttention, "script"),
    "rows_transformer": (RowsTransformer, "script"),
    "resnet18": (resnet18, "script"),
    "mobilenet_v3_small": (mobilenet_v3_small, "script"),
    "efficientnet_b0": (efficientnet_b0, "script"),
    "convnext": (convnext, "script"),
    "vision_transformer": (vision_transformer, "script"),
}


def compiled(name, model):
    """The model as its user saves it: scripted, or traced on two images in evaluation mode (a
    trace keeps the mode it was traced in, so it trains with BatchNorm's running statistics and
    without dropout)."""
    if MODELS[name][1] == "script":
        return torch.jit.script(model)
    return torch.jit.trace(model.eval(), torch.randn(2, 1, 28, 28))
