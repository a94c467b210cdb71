#!/usr/bin/python3
"""A small transformer trained with exact and with random-feature attention, side by side:
Fashion-MNIST images read as sequences of patches (--patch 1: 784 one-pixel tokens; 2: 196
tokens of 2x2; 7: 16 tokens of 7x7), classified from the mean of the last block's tokens.

The two models are the same but for their attention: torch.nn.MultiheadAttention (batch_first,
PyTorch's own), or afterburner.nn.RandMultiHeadAttention (FAVOR+, softmax features, m random
features). Same initial weights where they share them, same data order, same recipe (AdamW, lr
1e-3, cosine to 0, batch 64, fp32, 2 threads); each trains for --epochs on the first --train
images and is evaluated on the 10,000 test images. The two alternate within each of --reps
repetitions (a different seed each); printed: test accuracy and training seconds per model, the
medians, and the time ratio.

    PYTHONPATH=build/python /usr/bin/python3 bench/performer_transformer.py [--patch 2] [--reps 3]
        [--train 20000] [--epochs 1] [--embed 64] [--heads 4] [--layers 2] [--features 64]
"""
import argparse
import statistics
import time

import torch
from torch import nn

from afterburner import nn as abnn
from pytorch_train import DEFAULT_DATA_DIR, MEAN, STD, load_split


def split(name, patch):
    images, labels = load_split(DEFAULT_DATA_DIR, name)
    images = (images.float() / 255 - MEAN) / STD
    n, side = images.shape[0], 28 // patch
    tokens = images.view(n, side, patch, side, patch).permute(0, 1, 3, 2, 4).reshape(n, side * side, patch * patch)
    return tokens.contiguous(), labels


class Block(nn.Module):
    def __init__(self, attention, embed):
        super().__init__()
        self.attention, self.norm1, self.norm2 = attention, nn.LayerNorm(embed), nn.LayerNorm(embed)
        self.mlp = nn.Sequential(nn.Linear(embed, 4 * embed), nn.GELU(), nn.Linear(4 * embed, embed))

    def forward(self, x):
        y = self.norm1(x)
        x = x + self.attention(y, y, y, need_weights=False)[0] if isinstance(self.attention, nn.MultiheadAttention) \
            else x + self.attention(y, y, y)[0]
        return x + self.mlp(self.norm2(x))


class Classifier(nn.Module):
    def __init__(self, kind, tokens, token_dim, args):
        super().__init__()
        self.embed = nn.Linear(token_dim, args.embed)
        self.position = nn.Parameter(torch.randn(1, tokens, args.embed) * 0.02)
        blocks = []
        for _ in range(args.layers):
            mha = nn.MultiheadAttention(args.embed, args.heads, batch_first=True)
            attention = mha if kind == "exact" else abnn.make_performer(mha, args.features, "softmax", False,
                                                                          seed=len(blocks))
            blocks.append(Block(attention, args.embed))
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.LayerNorm(args.embed), nn.Linear(args.embed, 10))

    def forward(self, x):
        return self.head(self.blocks(self.embed(x) + self.position).mean(1))


def train_and_test(kind, train, test, args, seed):
    torch.manual_seed(seed)
    model = Classifier(kind, train[0].shape[1], train[0].shape[2], args)
    steps = args.epochs * ((len(train[0]) + 63) // 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    order = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    model.train()
    for _ in range(args.epochs):
        for batch in torch.randperm(len(train[0]), generator=order).split(64):
            loss = nn.functional.cross_entropy(model(train[0][batch]), train[1][batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        correct = sum((model(x).argmax(1) == y).sum().item() for x, y in zip(test[0].split(100), test[1].split(100)))
    return correct / len(test[0]), seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patch", type=int, default=2, choices=[1, 2, 4, 7, 14])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--train", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--embed", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--features", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(2)
    train = tuple(t[:args.train] for t in split("train", args.patch))
    test = split("t10k", args.patch)
    print(f"{train[0].shape[1]} tokens of {train[0].shape[2]} pixels; {args.train} training images, "
          f"{args.epochs} epoch(s); embed {args.embed}, {args.heads} heads, {args.layers} blocks, "
          f"m = {args.features}")
    results = {"exact": [], "performer": []}
    for rep in range(args.reps):
        for kind in results:
            accuracy, seconds = train_and_test(kind, train, test, args, seed=rep)
            results[kind].append((accuracy, seconds))
            print(f"  repetition {rep + 1}: {kind:9s} test accuracy {accuracy:.4f}, {seconds:.1f} s of training",
                  flush=True)
    medians = {}
    for kind, values in results.items():
        accuracies, seconds = [a for a, _ in values], [s for _, s in values]
        medians[kind] = statistics.median(seconds)
        print(f"{kind:9s} accuracy {statistics.median(accuracies):.4f} [{min(accuracies):.4f}-{max(accuracies):.4f}], "
              f"{medians[kind]:.1f} s [{min(seconds):.1f}-{max(seconds):.1f}]")
    print(f"performer's training time over exact's: {medians['performer'] / medians['exact']:.2f}x")


if __name__ == "__main__":
    main()
