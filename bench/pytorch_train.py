#!/usr/bin/python3
"""The Python PyTorch peer of `afterburner train`: the same training run, written the way a
PyTorch user would write it, so the benchmark compares the two side by side.

    /usr/bin/python3 bench/pytorch_train.py --model cnn --precision bf16 --report out.json

Data: Fashion-MNIST from the IDX .gz files; per sample uint8 -> /255 -> normalize(0.2860,
0.3530), and for training also zero-pad 2 then a random 28x28 crop (torchvision's
ToTensor + Normalize + RandomCrop(28, padding=2), written out because torchvision is absent).
Optimizer: SGD with momentum (0.9, optionally Nesterov) and weight decay; loss: cross-entropy;
learning rate constant, or one of afterburner's schedules (cosine with linear warm-up,
onecycle) written with the same formulas (src/train/optim.cpp). bf16 means
torch.autocast("cpu", torch.bfloat16) around forward + loss (training and evaluation).
--no-augment drops the random crop. --target-accuracy A stops at the first evaluation that
reaches A (evaluations at epoch ends, and every --eval-every steps).

Distributed: with torchrun's variables set (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and
WORLD_SIZE > 1, each process is one rank of DistributedDataParallel on a Gloo group, written the
way its tutorial writes it: DistributedSampler (set_epoch every epoch), --batch-size per rank,
every rank evaluating. Rank 0 writes the report, its samples counting all ranks, with DDP's own
communication figures (_get_ddp_logging_data) under "communication".

afterburner's Python package: --afterburner PIECES swaps its pieces into this same loop, a
comma-separated list of fuse (afterburner.nn.fuse on the model), loss
(afterburner.nn.functional.cross_entropy), optim (afterburner.optim.FlatSGD), heap
(afterburner.heap.keep_freed_memory), loader (afterburner.data.Loader with --workers threads and
the same transforms, batched, instead of the DataLoader), or all; with --script (training
torch.jit.script(model)), jit (afterburner.jit.fuse on the scripted model). The package must be importable (installed, or
PYTHONPATH=build/python).

Timing matches afterburner's: a step runs from asking the DataLoader for a batch through
optimizer.step(), so it includes data wait; train_samples_per_sec is trained samples over the
summed step time of all epochs. epoch_seconds is the wall time of each epoch's training loop
(including starting the loader's iterator). Evaluation (batch 128, inference_mode) is not timed.

The --report JSON has test_accuracy (fraction in [0, 1], of the last evaluation),
test_accuracy_per_epoch, train_seconds_to_target and samples_to_target (null unless reached),
evaluations (step, samples, train_seconds, accuracy of each), steps, train_samples_per_sec, epoch_seconds (list), peak_rss_mb (this
process), peak_rss_children_mb (the largest DataLoader worker, taken after the workers exit;
forked workers share pages with the parent, so the two must not be added), precision, model,
batch_size, threads, workers, plus epochs, channels_last, framework and torch_version.
"""

import argparse
import gc
import gzip
import json
import math
import resource
import struct
import sys
import time
from pathlib import Path

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

MEAN, STD = 0.2860, 0.3530
PAD = 2
DEFAULT_DATA_DIR = Path("/usr/share/datasets/fashion-mnist")
EVAL_BATCH_SIZE = 128  # untimed; batch 1000 evaluates 4-5x slower on this CPU (docs/time-to-accuracy.md)
IDX_UBYTE_MAGIC = {1: 0x0801, 3: 0x0803}  # labels, images


def read_idx(path, dims):
    """An IDX ubyte file as a uint8 tensor of `dims` dimensions, decompressed straight into
    one writable buffer (no transient second copy to inflate peak RSS)."""
    try:
        with gzip.open(path, "rb") as f:
            header = f.read(4 + 4 * dims)
            if len(header) < 4 + 4 * dims:
                sys.exit(f"{path}: {len(header)} bytes, shorter than the IDX header")
            magic, *shape = struct.unpack(f">{1 + dims}I", header)
            if magic != IDX_UBYTE_MAGIC[dims]:
                sys.exit(f"{path}: bad IDX magic {magic:#x}, expected {IDX_UBYTE_MAGIC[dims]:#x}")
            data = bytearray(torch.Size(shape).numel())
            if f.readinto(data) != len(data) or f.read(1):
                sys.exit(f"{path}: data size does not match the header's shape {shape}")
    except OSError as e:
        sys.exit(f"{path}: cannot read ({e.strerror or e})")
    return torch.frombuffer(data, dtype=torch.uint8).view(*shape)


def load_split(data_dir, prefix):
    images = read_idx(data_dir / f"{prefix}-images-idx3-ubyte.gz", 3)
    labels = read_idx(data_dir / f"{prefix}-labels-idx1-ubyte.gz", 1).long()
    if len(images) != len(labels):
        sys.exit(f"{data_dir}/{prefix}: {len(images)} images but {len(labels)} labels")
    return images, labels


class FashionMnist(Dataset):
    """uint8 images transformed per sample; `augment` adds the padded random crop."""

    def __init__(self, images, labels, augment):
        self.images, self.labels, self.augment = images, labels, augment

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        image = self.images[index].unsqueeze(0).float().div_(255).sub_(MEAN).div_(STD)
        if self.augment:
            image = random_crop(F.pad(image, (PAD, PAD, PAD, PAD)), self.images.shape[-2:])
        return image, self.labels[index]


def random_crop(image, size):
    height, width = size
    top = torch.randint(0, image.shape[-2] - height + 1, ()).item()
    left = torch.randint(0, image.shape[-1] - width + 1, ()).item()
    return image[..., top:top + height, left:left + width]


MODEL_NAMES = ("cnn", "mlp")


def build_model(name):
    """The models of afterburner's zoo, layer for layer, so state_dict keys match its
    torch::nn::Sequential ("0.weight", ...). Default PyTorch initialisation."""
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(28 * 28, 1024), nn.ReLU(),
            nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    raise ValueError(f"model: unknown model '{name}' (known: {', '.join(MODEL_NAMES)})")


def schedule_factor(kind, step, total_steps, warmup_steps):
    """The learning rate of `step` as a fraction of the peak: afterburner's LrSchedule::lr_at."""
    if kind == "constant":
        return 1.0
    total = max(total_steps, 1)

    def cosine(start, end, t):
        return end + (start - end) * (1 + math.cos(math.pi * t)) / 2

    if kind == "cosine":
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return cosine(1.0, 0.0, min(1.0, (step - warmup_steps) / max(total - warmup_steps, 1)))
    start, peak_step = 1 / 25, max(1.0, 0.3 * total - 1)  # onecycle: pct_start 0.3, div_factor 25
    if step <= peak_step:
        return cosine(start, 1.0, step / peak_step)
    return cosine(1.0, start / 1e4, min(1.0, (step - peak_step) / max(1.0, total - 1 - peak_step)))


AFTERBURNER_PIECES = ("fuse", "loss", "optim", "heap", "loader")  # "all"
SCRIPTED_PIECES = ("jit",)  # for --script


def afterburner_pieces(text):
    pieces = set(AFTERBURNER_PIECES) if text == "all" else set(filter(None, text.split(",")))
    known = AFTERBURNER_PIECES + SCRIPTED_PIECES
    unknown = pieces - set(known)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown pieces {sorted(unknown)} (known: {', '.join(known)}, all)")
    return pieces


class Trainer:
    """One model with its optimizer, schedule and precision: trains and measures accuracy."""

    def __init__(self, model, args, steps_per_epoch):
        self.memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
        self.model = model.to(memory_format=self.memory_format)
        optimizer = torch.optim.SGD
        self.cross_entropy = F.cross_entropy
        if args.afterburner:
            import afterburner
            if "fuse" in args.afterburner:
                afterburner.nn.fuse(model)
            if "loss" in args.afterburner:
                self.cross_entropy = afterburner.nn.functional.cross_entropy
            if "optim" in args.afterburner:
                optimizer = afterburner.optim.FlatSGD
            if "heap" in args.afterburner:
                afterburner.heap.keep_freed_memory()
        if args.script:  # the scripted module shares the parameters the optimizer steps
            self.model = torch.jit.script(self.model)
            if "jit" in args.afterburner:
                self.model = afterburner.jit.fuse(self.model)[0]
        self.optimizer = optimizer(model.parameters(), lr=args.lr, momentum=args.momentum,
                                   nesterov=args.nesterov, weight_decay=args.weight_decay)
        total_steps = steps_per_epoch * args.epochs
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: schedule_factor(args.schedule, step, total_steps, args.warmup_steps))
        self.bf16 = args.precision == "bf16"
        self.max_steps = args.max_steps
        self.eval_every = args.eval_every
        self.target = args.target_accuracy
        self.step, self.samples, self.step_seconds = 0, 0, 0.0
        self.evaluations = []
        self.seconds_to_target = self.samples_to_target = None

    def autocast(self):
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16)

    def logits(self, images):
        return self.model(images.contiguous(memory_format=self.memory_format))

    def train_epoch(self, loader, test_loader):
        """Trains until the epoch's end or the target; returns the epoch's wall seconds."""
        self.model.train()
        epoch_start = time.perf_counter()
        batches = iter(loader)
        steps = len(loader) if self.max_steps is None else min(len(loader), self.max_steps)
        for _ in range(steps):
            step_start = time.perf_counter()
            images, labels = next(batches)
            with self.autocast():
                loss = self.cross_entropy(self.logits(images), labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
            self.step_seconds += time.perf_counter() - step_start
            self.samples += len(labels)
            self.step += 1
            if self.eval_every and self.step % self.eval_every == 0 and self.evaluate(test_loader):
                break
        return time.perf_counter() - epoch_start

    def evaluate(self, loader):
        """Records an evaluation; True once the target is reached."""
        if self.evaluations and self.evaluations[-1]["step"] == self.step:
            accuracy = self.evaluations[-1]["accuracy"]
        else:
            accuracy = self.accuracy(loader)
            self.evaluations.append({"step": self.step, "samples": self.samples,
                                     "train_seconds": self.step_seconds, "accuracy": accuracy})
        if self.target and accuracy >= self.target and self.seconds_to_target is None:
            self.seconds_to_target, self.samples_to_target = self.step_seconds, self.samples
        return self.seconds_to_target is not None

    def accuracy(self, loader):
        self.model.eval()
        correct = total = 0
        with torch.inference_mode(), self.autocast():
            for images, labels in loader:
                correct += (self.logits(images).argmax(1) == labels).sum().item()
                total += len(labels)
        self.model.train()
        return correct / total


def world_size():
    return int(os.environ.get("WORLD_SIZE", "1"))


def make_afterburner_loaders(args):
    """afterburner.data.Loader over the same images with the same transforms, batched."""
    from afterburner import data
    common = dict(workers=args.workers, seed=args.seed, scale=1 / 255, mean=[MEAN], std=[STD])
    images, labels = load_split(args.data, "train")
    train = data.Loader(images.unsqueeze(1), labels, batch_size=args.batch_size, shuffle=True, drop_last=True,
                        random_crop=PAD if args.augment else 0, **common)
    images, labels = load_split(args.data, "t10k")
    test = data.Loader(images.unsqueeze(1), labels, batch_size=EVAL_BATCH_SIZE, shuffle=False, drop_last=False,
                       **common)
    return train, test


def make_loaders(args):
    if "loader" in args.afterburner:
        if world_size() > 1:
            sys.exit("--afterburner loader: not with torchrun (no DistributedSampler)")
        return make_afterburner_loaders(args)
    train_set = FashionMnist(*load_split(args.data, "train"), augment=args.augment)
    test_set = FashionMnist(*load_split(args.data, "t10k"), augment=False)
    workers = dict(num_workers=args.workers, persistent_workers=args.workers > 0)
    if world_size() > 1:
        sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed, drop_last=True)
        train = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True, **workers)
    else:
        train = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True,
                           **workers)
    if len(train) == 0:
        sys.exit(f"batch-size: {args.batch_size} is more than the {len(train_set)} training samples")
    test = DataLoader(test_set, batch_size=EVAL_BATCH_SIZE, **workers)
    return train, test


def peak_rss_mb(who):
    return resource.getrusage(who).ru_maxrss / 1024  # ru_maxrss is in KiB on Linux


def communication(model):
    """DDP's own averages over its sampled steps, in ms: comm time and the part hidden behind backward."""
    data = model._get_ddp_logging_data()
    return {"ms_per_step": data.get("avg_backward_comm_time", 0) / 1e6,
            "hidden_ms_per_step": data.get("avg_backward_compute_comm_overlap_time", 0) / 1e6}


def run(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if world_size() > 1:
        dist.init_process_group("gloo")
    train_loader, test_loader = make_loaders(args)
    model = build_model(args.model)
    if world_size() > 1:
        model = DistributedDataParallel(model)
    trainer = Trainer(model, args, len(train_loader))
    epoch_seconds, accuracies = [], []
    for epoch in range(args.epochs):
        if world_size() > 1:
            train_loader.sampler.set_epoch(epoch)
        samples_before, seconds_before = trainer.samples, trainer.step_seconds
        epoch_seconds.append(trainer.train_epoch(train_loader, test_loader))
        reached = trainer.evaluate(test_loader)
        accuracies.append(trainer.evaluations[-1]["accuracy"])
        print(f"epoch {epoch + 1}: {(trainer.samples - samples_before) / (trainer.step_seconds - seconds_before):.0f} "
              f"samples/s, {epoch_seconds[-1]:.1f} s, test accuracy {accuracies[-1]:.4f}", file=sys.stderr)
        if reached:
            break
    # Persistent workers only count towards RUSAGE_CHILDREN once they have exited.
    del train_loader, test_loader
    gc.collect()
    distributed = {}
    if world_size() > 1:
        distributed = {"world_size": world_size(), "communication": communication(model)}
        dist.destroy_process_group()
    return {
        **distributed,
        "test_accuracy": accuracies[-1],
        "test_accuracy_per_epoch": accuracies,
        "train_samples_per_sec": trainer.samples * world_size() / trainer.step_seconds,
        "train_seconds": trainer.step_seconds,
        "train_seconds_to_target": trainer.seconds_to_target,
        "samples_to_target": trainer.samples_to_target,
        "steps": trainer.step,
        "evaluations": trainer.evaluations,
        "epoch_seconds": epoch_seconds,
        "peak_rss_mb": peak_rss_mb(resource.RUSAGE_SELF),
        "peak_rss_children_mb": peak_rss_mb(resource.RUSAGE_CHILDREN),
        "precision": args.precision,
        "model": args.model,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "workers": args.workers,
        "epochs": args.epochs,
        "channels_last": args.channels_last,
        "framework": "pytorch",
        "afterburner_pieces": sorted(args.afterburner),
        "torch_version": torch.__version__,
    }


def summary(r):
    reached = r["train_seconds_to_target"]
    return (f"pytorch {r['model']} {r['precision']}: {r['train_samples_per_sec']:.0f} samples/s, "
            f"test accuracy {100 * r['test_accuracy']:.2f}% after {r['steps']} steps, "
            + (f"target reached after {reached:.1f} s of training, " if reached is not None else "") +
            f"epoch {' '.join(f'{s:.1f}' for s in r['epoch_seconds'])} s, "
            f"peak RSS {r['peak_rss_mb']:.0f} MB (largest worker {r['peak_rss_children_mb']:.0f} MB), "
            f"batch {r['batch_size']}, threads {r['threads']}, workers {r['workers']}")


def positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text}")
    return value


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", choices=MODEL_NAMES, default="cnn", help="model to train")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16 autocasts forward + loss")
    p.add_argument("--epochs", type=positive_int, default=1, help="passes over the training set")
    p.add_argument("--batch-size", type=positive_int, default=128, help="training batch size")
    p.add_argument("--lr", type=float, default=0.05, help="SGD (peak) learning rate")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--nesterov", action="store_true", help="Nesterov momentum")
    p.add_argument("--schedule", choices=("constant", "cosine", "onecycle"), default="constant",
                   help="learning-rate schedule over --epochs (afterburner's formulas)")
    p.add_argument("--warmup-steps", type=non_negative_int, default=0, help="linear warm-up of the cosine schedule")
    p.add_argument("--augment", action=argparse.BooleanOptionalAction, default=True,
                   help="random crop (pad 2) of training images")
    p.add_argument("--target-accuracy", type=float, default=0.0,
                   help="stop at the first evaluation with at least this test accuracy (0 = off)")
    p.add_argument("--eval-every", type=non_negative_int, default=0,
                   help="also evaluate every N steps (0 = at epoch ends only)")
    p.add_argument("--weight-decay", type=float, default=5e-4, help="SGD weight decay")
    p.add_argument("--threads", type=positive_int, default=2, help="torch.set_num_threads")
    p.add_argument("--workers", type=non_negative_int, default=2, help="DataLoader workers")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed")
    p.add_argument("--channels-last", action="store_true",
                   help="model and input in torch.channels_last")
    p.add_argument("--max-steps", type=positive_int, metavar="N",
                   help="cut each epoch after N steps (accuracy is still measured)")
    p.add_argument("--afterburner", type=afterburner_pieces, default=set(), metavar="PIECES",
                   help="afterburner's pieces swapped in: fuse,loss,optim,heap,loader or all; jit with --script")
    p.add_argument("--script", action="store_true", help="train torch.jit.script(model), as TorchScript users do")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR,
                   help="directory holding the Fashion-MNIST IDX .gz files")
    p.add_argument("--report", type=Path, metavar="FILE",
                   help="write the results as JSON to FILE")
    return p.parse_args(argv)


def main():
    args = parse_args()
    if "jit" in args.afterburner and not args.script:
        sys.exit("--afterburner jit: fuses a scripted model; add --script")
    result = run(args)
    if int(os.environ.get("RANK", "0")) != 0:
        return
    print(summary(result))
    if args.report:
        args.report.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
