#!/usr/bin/python3
"""Data-parallel training side by side: `afterburner train --nproc 2` against Python's
DistributedDataParallel with 2 ranks, and each against its own single process, alternating
A B C D A B C D ... in one run.

    /usr/bin/python3 bench/ddp_vs_pytorch.py [--build build] [--reps 3] [--epochs 1]

  afterburner-2    afterburner train --nproc 2: 2 ranks, each pinned to 1 core, 1 thread, 1 loader worker
  pytorch-ddp-2    bench/pytorch_train.py as 2 processes with RANK, WORLD_SIZE, MASTER_ADDR and
                   MASTER_PORT set (torchrun's contract, without torchrun), each pinned with taskset
                   to 1 core, 1 thread, 1 DataLoader worker: DDP on Gloo, DistributedSampler
  afterburner-1    afterburner train: 1 process, 2 threads
  pytorch-1        bench/pytorch_train.py: 1 process, 2 threads, 2 DataLoader workers

All: the cnn, bf16 autocast, 128 samples per step over all ranks (64 per rank with 2 ranks), SGD
with afterburner's recipe (Nesterov, lr 0.1, weight decay 5e-4, cosine with 100 warm-up steps),
no augmentation, --epochs over Fashion-MNIST. A run's figure is its training samples per second
over all ranks (data wait included, evaluation excluded); the communication figures are each
engine's own (c10d's Reducer timer: from the first bucket's allreduce to the last one's end, and
the part of it while backward still computed). Prints each contestant's median with min and max,
afterburner-2 over pytorch-ddp-2 as the median of the per-round ratios, and each framework's
scaling efficiency (2 ranks over 1 process).
"""

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECIPE = ["--lr", "0.1", "--nesterov", "--schedule", "cosine", "--warmup-steps", "100", "--weight-decay", "5e-4",
          "--momentum", "0.9", "--no-augment"]
GLOBAL_BATCH = 128


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(process, command):
    if process.returncode != 0:
        sys.exit(f"failed ({process.returncode}): {shlex.join(command)}\n{process.stderr}")


def afterburner(args, nproc, report):
    command = [str(Path(args.build) / "afterburner"), "train", "--epochs", str(args.epochs), "--precision", "bf16",
               "--batch-size", str(GLOBAL_BATCH), "--progress", "none", "--report", report, "--nproc", str(nproc)]
    check(subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), command)
    return json.loads(Path(report).read_text())


def python_command(args, batch, threads, workers, report):
    return ["/usr/bin/python3", str(HERE / "pytorch_train.py"), "--model", "cnn", "--precision", "bf16",
            "--epochs", str(args.epochs), "--batch-size", str(batch), "--threads", str(threads),
            "--workers", str(workers), "--report", report, *RECIPE]


def pytorch_single(args, report):
    command = python_command(args, GLOBAL_BATCH, 2, 2, report)
    check(subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), command)
    return json.loads(Path(report).read_text())


def pytorch_ddp(args, report):
    port = str(free_port())
    ranks = []
    for rank in range(2):
        command = ["taskset", "-c", str(rank), *python_command(args, GLOBAL_BATCH // 2, 1, 1, report)]
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port)
        ranks.append((subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       text=True), command))
    for process, command in ranks:
        process.stderr_text = process.communicate()[1]
        if process.returncode != 0:
            sys.exit(f"failed ({process.returncode}): {shlex.join(command)}\n{process.stderr_text}")
    return json.loads(Path(report).read_text())


CONTESTANTS = {
    "afterburner-2": lambda args, report: afterburner(args, 2, report),
    "pytorch-ddp-2": pytorch_ddp,
    "afterburner-1": lambda args, report: afterburner(args, 1, report),
    "pytorch-1": pytorch_single,
}


def spread(values):
    return f"{statistics.median(values):8.0f} ({min(values):.0f}-{max(values):.0f})"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build", help="the CMake build directory holding afterburner")
    p.add_argument("--reps", type=int, default=3, help="rounds of the four contestants")
    p.add_argument("--epochs", type=int, default=1, help="epochs each run trains")
    args = p.parse_args()
    speeds = {name: [] for name in CONTESTANTS}
    comm = {name: [] for name in CONTESTANTS}
    accuracy = {name: [] for name in CONTESTANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for name, run in CONTESTANTS.items():
                report = run(args, str(Path(tmp) / f"{name}-{rep}.json"))
                speeds[name].append(report["train_samples_per_sec"])
                accuracy[name].append(report["test_accuracy"])
                if report.get("communication"):
                    comm[name].append(report["communication"])
                print(f"round {rep + 1} {name:14} {report['train_samples_per_sec']:7.0f} samples/s, "
                      f"test accuracy {report['test_accuracy']:.4f}", flush=True)
    print(f"\n{'contestant':14} {'samples/s, median (min-max)':>30} {'comm ms/step':>13} {'hidden':>7} {'accuracy':>9}")
    for name in CONTESTANTS:
        ms = [c["ms_per_step"] for c in comm[name]]
        hidden = [c["hidden_ms_per_step"] / c["ms_per_step"] for c in comm[name] if c["ms_per_step"] > 0]
        comm_text = f"{statistics.median(ms):13.2f} {100 * statistics.median(hidden):6.0f}%" if ms else f"{'-':>13} {'-':>7}"
        print(f"{name:14} {spread(speeds[name]):>30} {comm_text} {statistics.median(accuracy[name]):9.4f}")
    ratios = [a / b for a, b in zip(speeds["afterburner-2"], speeds["pytorch-ddp-2"])]
    print(f"\nafterburner-2 / pytorch-ddp-2: {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
    for framework in ("afterburner", "pytorch"):
        two = speeds["afterburner-2" if framework == "afterburner" else "pytorch-ddp-2"]
        efficiency = [b / a for a, b in zip(speeds[f"{framework}-1"], two)]
        print(f"{framework} scaling, 2 ranks over 1 process: {statistics.median(efficiency):.2f}x "
              f"({min(efficiency):.2f}-{max(efficiency):.2f})")


if __name__ == "__main__":
    main()
