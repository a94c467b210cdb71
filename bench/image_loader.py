#!/usr/bin/python3
"""Decode + augment throughput from an image folder: afterburner.data.ImageFolder (C++ worker
threads, reduced-scale JPEG decoding, one resampling pass) against torchvision's ImageFolder +
DataLoader with the transforms of PyTorch's ImageNet example (RandomResizedCrop, RandomHorizontalFlip,
ToTensor, Normalize), in one process, alternating; images/s over the same number of images per
round, medians of --reps rounds with min and max, and the ratio.

    /usr/bin/python3 bench/make_image_folder.py /tmp/jpegs          # 20,000 + 2,000 JPEGs of 300-500 px
    PYTHONPATH=build/python /usr/bin/python3 bench/image_loader.py /tmp/jpegs/train [--reps 3] [--images 3200]
        [--size 224] [--batch 64] [--workers 0,1,2,3,4] [--eval] [--pack train.abpk ...] [--bf16-channels-last]

torchvision runs two ways: PIL's decoder and transforms (ImageFolder's default, the tutorials'), and
torchvision.io's decoder with the same transforms on uint8 tensors; each round's ratio is against
the faster of the two. Each side runs at its best worker count, measured first over --workers on a
share of the images (torchvision's: worker processes, persistent; afterburner's: threads); the files are read once
before the rounds so that both find them in the page cache. --eval measures the evaluation
transforms instead (Resize(256) + CenterCrop(224); afterburner's centre box). Each --pack (a
pack of the same folder, `afterburner data pack`) adds an afterburner side reading it, with its own
ratio against the same torchvision rounds. --bf16-channels-last: batches as a bf16 channels_last
model takes them (afterburner's decoder writes them so; torchvision's workers convert each batch in
their collate_fn, off the main process).
"""
import argparse
import functools
import pathlib
import statistics
import time

import torch
import torchvision
import torchvision.transforms as T

import afterburner
from machine import cpu_description, load_description

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def afterburner_loader(args, workers, root=None):
    return afterburner.data.ImageFolder(root or args.root, size=args.size, train=not args.eval,
                                        batch_size=args.batch, mean=MEAN, std=STD, workers=workers, shuffle=True,
                                        drop_last=True, channels_last=args.bf16_channels_last,
                                        dtype=torch.bfloat16 if args.bf16_channels_last else torch.float32)


def bf16_channels_last_batch(samples):
    images, labels = torch.utils.data.default_collate(samples)
    return images.to(memory_format=torch.channels_last).to(torch.bfloat16), labels


def decoded_by_torchvision_io(path):
    """torchvision.io's libjpeg decoding to a uint8 tensor (PIL's decoder is the ImageFolder default)."""
    return torchvision.io.decode_image(torchvision.io.read_file(path), torchvision.io.ImageReadMode.RGB)


def torchvision_loader(args, workers, tensors=False):
    """PyTorch's ImageNet example: PIL images through the PIL transforms, or (tensors) torchvision.io's
    decoder and the same transforms on uint8 tensors (antialiased)."""
    size, resize = args.size, args.size * 256 // 224
    if tensors:
        crop = [T.Resize(resize, antialias=True), T.CenterCrop(size)] if args.eval else \
            [T.RandomResizedCrop(size, antialias=True), T.RandomHorizontalFlip()]
        transform = T.Compose(crop + [T.ConvertImageDtype(torch.float32), T.Normalize(MEAN, STD)])
    else:
        crop = [T.Resize(resize), T.CenterCrop(size)] if args.eval else [T.RandomResizedCrop(size),
                                                                        T.RandomHorizontalFlip()]
        transform = T.Compose(crop + [T.ToTensor(), T.Normalize(MEAN, STD)])
    dataset = torchvision.datasets.ImageFolder(args.root, transform=transform,
                                               loader=decoded_by_torchvision_io if tensors else
                                               torchvision.datasets.folder.default_loader)
    return torch.utils.data.DataLoader(dataset, batch_size=args.batch, shuffle=True, drop_last=True,
                                       num_workers=workers, persistent_workers=workers > 0,
                                       collate_fn=bf16_channels_last_batch if args.bf16_channels_last else None)


SIDES = {"afterburner": afterburner_loader, "torchvision": torchvision_loader,
         "torchvision.io": lambda args, workers: torchvision_loader(args, workers, tensors=True)}


def images_per_second(loader, images):
    """Images/s of iterating `loader` (from its start) until `images` have come out."""
    seen = 0
    start = time.perf_counter()
    while seen < images:
        for inputs, _ in loader:
            seen += inputs.shape[0]
            if seen >= images:
                break
    return seen / (time.perf_counter() - start)


def best_workers(side, args):
    rates = {w: images_per_second(SIDES[side](args, w), args.images // 4) for w in args.workers}
    best = max(rates, key=rates.get)
    print(f"{side}: workers {', '.join(f'{w}: {r:.0f}/s' for w, r in rates.items())} -> {best}", flush=True)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--images", type=int, default=3200)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", default="0,1,2,3,4")
    parser.add_argument("--eval", action="store_true")
    parser.add_argument("--pack", action="append", default=[])
    parser.add_argument("--bf16-channels-last", action="store_true")
    args = parser.parse_args()
    args.workers = [int(w) for w in args.workers.split(",")]
    for pack in args.pack:
        SIDES[f"afterburner {pathlib.Path(pack).name}"] = functools.partial(afterburner_loader, root=pack)
        with open(pack, "rb") as file:  # into the page cache
            while file.read(1 << 24):
                pass
    torch.set_num_threads(2)
    print(f"{cpu_description()}; {load_description()}; {'evaluation' if args.eval else 'training'} transforms, "
          f"{args.size} px, batch {args.batch}{', bf16 channels_last' if args.bf16_channels_last else ''}", flush=True)
    for path in torchvision.datasets.ImageFolder(args.root).samples:  # into the page cache, for both sides
        with open(path[0], "rb") as file:
            file.read()
    workers = {side: best_workers(side, args) for side in SIDES}
    rates = {side: [] for side in SIDES}
    ours = [side for side in SIDES if side.startswith("afterburner")]
    ratios = {side: [] for side in ours}
    for round_index in range(args.reps):
        for side in SIDES:
            rates[side].append(images_per_second(SIDES[side](args, workers[side]), args.images))
        peer = max(rates[side][-1] for side in SIDES if side not in ours)  # the faster torchvision
        for side in ours:
            ratios[side].append(rates[side][-1] / peer)
        print(f"  round {round_index + 1}: " + ", ".join(f"{side} {rates[side][-1]:.0f}" for side in SIDES) +
              " images/s -> " + ", ".join(f"{ratios[side][-1]:.2f}x" for side in ours) + " the faster torchvision",
              flush=True)
    width = max(len(side) for side in SIDES)
    for side in SIDES:
        print(f"{side:{width}} {statistics.median(rates[side]):7.0f} images/s ({min(rates[side]):.0f}-"
              f"{max(rates[side]):.0f}), {workers[side]} workers")
    for side in ours:
        print(f"ratio of {side}: {statistics.median(ratios[side]):.2f}x ({min(ratios[side]):.2f}-"
              f"{max(ratios[side]):.2f}) over the faster torchvision of each round")
    print(load_description())


if __name__ == "__main__":
    main()
