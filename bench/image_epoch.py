#!/usr/bin/python3
"""Training torchvision's ResNet-18 on an image folder decoded each step: `afterburner train
--model resnet18.pt --data ROOT` (or a pack of it) against the Python loop with torchvision's
ImageFolder + DataLoader, alternating in one run; samples/s of the training steps and the share of
step time spent waiting for the next batch, medians of --reps rounds with min and max.

    PYTHONPATH=build/python /usr/bin/python3 bench/image_epoch.py /tmp/jpegs/train /tmp/jpegs/val
        [--pack train.abpk --val-pack val.abpk] [--size 112] [--batch 64] [--steps 60 | --epoch] [--reps 3]
        [--workers 2]

Both sides: the same scripted ResNet-18 weights (torch.manual_seed(0), classes of the folder),
RandomResizedCrop(--size) + horizontal flip + ImageNet normalisation, SGD lr 0.1 momentum 0.9
Nesterov, weight decay 5e-4, bf16 autocast where the CPU has AVX512-BF16 (fp32 otherwise),
channels_last, 2 threads, --workers loader workers (afterburner: threads; Python: persistent
processes, torchvision.io's decoder, the faster torchvision variant in bench/image_loader.py).
afterburner's figures are its report's (training steps only; its `data` phase is the wait for the
next batch); Python's are timed the same way around its loop, after 5 warm-up steps. --epoch: a
whole epoch each (no warm-up left out, a constant lr on both sides), then the accuracy on the
evaluation folder's centre crops (Resize(size * 256 / 224) + CenterCrop(size), as afterburner's).
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import tempfile
import time

import torch
import torchvision
import torchvision.transforms as T

from machine import cpu_description, load_description

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
WARMUP = 5


def native_bf16():
    return "avx512_bf16" in pathlib.Path("/proc/cpuinfo").read_text()


def python_accuracy(args, model):
    """Top-1 accuracy of `model` on the evaluation folder's centre crops."""
    transform = T.Compose([T.Resize(args.size * 256 // 224, antialias=True), T.CenterCrop(args.size),
                           T.ConvertImageDtype(torch.float32), T.Normalize(MEAN, STD)])
    dataset = torchvision.datasets.ImageFolder(args.val, transform=transform, loader=read_rgb)
    correct = 0
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16()):
        for images, labels in torch.utils.data.DataLoader(dataset, batch_size=128, num_workers=args.workers):
            correct += (model(images.to(memory_format=torch.channels_last)).argmax(1) == labels).sum().item()
    return correct / len(dataset)


def read_rgb(path):
    return torchvision.io.decode_image(torchvision.io.read_file(path), torchvision.io.ImageReadMode.RGB)


def python_round(args, model_file):
    """(samples/s, data wait share, test accuracy or None) of the Python loop."""
    model = torch.jit.load(model_file).train()  # the same weights as afterburner's
    eager = torchvision.models.resnet18(num_classes=len(torchvision.datasets.ImageFolder(args.train).classes))
    eager.load_state_dict(model.state_dict())
    eager = eager.to(memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    transform = T.Compose([T.RandomResizedCrop(args.size, antialias=True), T.RandomHorizontalFlip(),
                           T.ConvertImageDtype(torch.float32), T.Normalize(MEAN, STD)])
    dataset = torchvision.datasets.ImageFolder(args.train, transform=transform, loader=read_rgb)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, persistent_workers=args.workers > 0)
    batches = iter(loader)
    waited = total = 0.0
    warmup, steps = (0, len(loader)) if args.epoch else (WARMUP, args.steps)
    for step in range(warmup + steps):
        start = time.perf_counter()
        images, labels = next(batches)
        got = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16()):
            loss = torch.nn.functional.cross_entropy(eager(images.to(memory_format=torch.channels_last)), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step >= warmup:
            waited += got - start
            total += time.perf_counter() - start
    return steps * args.batch / total, waited / total, python_accuracy(args, eager) if args.epoch else None


def afterburner_round(args, model_file):
    with tempfile.TemporaryDirectory() as scratch:
        report = pathlib.Path(scratch) / "report.json"
        data = ["--data", args.pack, "--val-data", args.val_pack] if args.pack else \
            ["--data", args.train, "--val-data", args.val, "--decode", "each-epoch"]
        length = ["--schedule", "constant"] if args.epoch else ["--max-steps", str(WARMUP + args.steps)]
        run = subprocess.run([args.binary, "train", "--model", model_file, *data, "--image-size", str(args.size),
                              "--batch-size", str(args.batch), "--workers", str(args.workers), "--threads", "2",
                              "--epochs", "1", *length, "--report", str(report)], capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(run.stderr)
        result = json.loads(report.read_text())
        timing = result["timing"]
        return (timing["samples_per_sec"], timing["phases"]["data"]["total_s"] / timing["total_s"],
                result["test_accuracy"] if args.epoch else None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("train")
    parser.add_argument("val")
    parser.add_argument("--pack")
    parser.add_argument("--val-pack")
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--epoch", action="store_true", help="a whole epoch each, then the test accuracy")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--binary", default="build/afterburner")
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    classes = torchvision.datasets.ImageFolder(args.train).classes
    print(f"{cpu_description()}; {load_description()}; ResNet-18 at {args.size} px, batch {args.batch}, "
          f"{'one epoch' if args.epoch else f'{args.steps} steps'}, {'bf16' if native_bf16() else 'fp32'}; "
          f"afterburner reads "
          f"{args.pack or args.train}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        model_file = str(pathlib.Path(scratch) / "resnet18.pt")
        torch.jit.script(torchvision.models.resnet18(num_classes=len(classes))).save(model_file)
        rounds = {"afterburner": [], "python": []}
        for index in range(args.reps):
            rounds["afterburner"].append(afterburner_round(args, model_file))
            rounds["python"].append(python_round(args, model_file))
            print(f"  round {index + 1}: " + ", ".join(
                f"{side} {rate:.1f} samples/s (data wait {100 * wait:.1f}%)" +
                ("" if accuracy is None else f", test accuracy {100 * accuracy:.2f}%")
                for side, ((rate, wait, accuracy),) in ((s, r[-1:]) for s, r in rounds.items())), flush=True)
    for side, results in rounds.items():
        rates, waits = [r for r, _, _ in results], [100 * w for _, w, _ in results]
        print(f"{side:12} {statistics.median(rates):6.1f} samples/s ({min(rates):.1f}-{max(rates):.1f}), data wait "
              f"{statistics.median(waits):.1f}% ({min(waits):.1f}-{max(waits):.1f}) of step time")
    if args.epoch:
        print("test accuracy after the epoch: " + ", ".join(
            f"{side} " + " / ".join(f"{100 * accuracy:.2f}%" for _, _, accuracy in results)
            for side, results in rounds.items()))
    ratios = [a[0] / p[0] for a, p in zip(rounds["afterburner"], rounds["python"])]
    print(f"ratio        {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}); {load_description()}")


if __name__ == "__main__":
    main()
