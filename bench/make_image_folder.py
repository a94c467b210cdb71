#!/usr/bin/python3
"""Writes an image folder for the loader benchmarks (no dataset can be downloaded here): each
Fashion-MNIST item scaled up to 110-260 px, tinted, and placed at a random spot on a textured
background of 300-500 px a side, saved as JPEG (quality 90) in torchvision's ImageFolder layout,
DIR/train/<class>/NNNNN.jpg and DIR/val/<class>/NNNNN.jpg: a learnable signal in photographs'
sizes.

    /usr/bin/python3 bench/make_image_folder.py DIR [--train 20000] [--val 2000] [--processes 2]
"""
import argparse
import gzip
import os
import struct
from concurrent.futures import ProcessPoolExecutor

import numpy
from PIL import Image

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
CLASSES = ["tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot"]


def idx(name):
    path = os.path.join(FASHION_MNIST, name)
    raw = open(path, "rb").read() if os.path.exists(path) else gzip.open(path + ".gz").read()
    dims = struct.unpack(f">{raw[3]}I", raw[4:4 + 4 * raw[3]])
    return numpy.frombuffer(raw, numpy.uint8, offset=4 + 4 * raw[3]).reshape(dims)


def photograph(item, generator):
    """One item on a background: uint8 [H, W, 3]."""
    height, width = generator.integers(300, 501, size=2)
    y, x = numpy.mgrid[0:height, 0:width]
    base = generator.uniform(40, 200, size=3)
    waves = [numpy.sin(x / generator.uniform(6, 40) + y / generator.uniform(6, 40) + generator.uniform(0, 6))
             for _ in range(3)]
    background = numpy.stack([base[c] + 35 * waves[c] for c in range(3)], -1) + generator.normal(0, 12, (height, width, 3))
    side = int(generator.integers(110, 261))
    side = min(side, height, width)
    shape = numpy.asarray(Image.fromarray(item).resize((side, side), Image.BILINEAR), numpy.float32) / 255
    tint = generator.uniform(0.4, 1.0, size=3) * 255
    top, left = generator.integers(0, height - side + 1), generator.integers(0, width - side + 1)
    patch = background[top:top + side, left:left + side]
    background[top:top + side, left:left + side] = patch * (1 - shape[..., None]) + tint * shape[..., None]
    return numpy.clip(background, 0, 255).astype(numpy.uint8)


def write_range(args):
    root, split, images, labels, first, seed = args
    generator = numpy.random.default_rng(seed)
    for index, (item, label) in enumerate(zip(images, labels)):
        folder = os.path.join(root, split, CLASSES[label])
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(photograph(item, generator)).save(os.path.join(folder, f"{first + index:05d}.jpg"), quality=90)
    return len(images)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--train", type=int, default=20000)
    parser.add_argument("--val", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    jobs = []
    for split, prefix, count in (("train", "train", args.train), ("val", "t10k", args.val)):
        images, labels = idx(f"{prefix}-images-idx3-ubyte")[:count], idx(f"{prefix}-labels-idx1-ubyte")[:count]
        step = max(1, count // (4 * args.processes))
        for first in range(0, count, step):
            jobs.append((args.root, split, images[first:first + step], labels[first:first + step], first,
                         first + (0 if split == "train" else 1_000_000)))
    with ProcessPoolExecutor(args.processes) as pool:
        written = sum(pool.map(write_range, jobs))
    print(f"wrote {written} JPEGs under {args.root}")


if __name__ == "__main__":
    main()
