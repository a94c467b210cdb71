"""torch.utils.data.DataLoader over Fashion-MNIST train: the Python peer of
bench_loader_throughput. Each sample goes uint8 tensor -> float / 255 -> normalize(0.2860,
0.3530) -> zero pad 2 -> random crop 28 in __getitem__, batch 128, drop_last, shuffled.

Run with Debian's interpreter, the one that has torch:
    /usr/bin/python3 bench/pytorch_loader.py [--data DIR] [--reps N] [--workers 0,2]
"""
import argparse
import gzip
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


def read_idx_gz(path, header_bytes):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read()[header_bytes:], dtype=np.uint8)


class AugmentedFashionMnist(Dataset):
    def __init__(self, directory):
        images = read_idx_gz(f"{directory}/train-images-idx3-ubyte.gz", 16)
        self.images = torch.from_numpy(images.copy()).view(-1, 1, 28, 28)
        self.labels = torch.from_numpy(read_idx_gz(f"{directory}/train-labels-idx1-ubyte.gz", 8).astype(np.int64))

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        image = self.images[index].float() / 255.0
        image = (image - 0.2860) / 0.3530
        padded = F.pad(image, (2, 2, 2, 2))
        top, left = torch.randint(0, 5, (2,)).tolist()
        return padded[:, top:top + 28, left:left + 28], self.labels[index]


def epoch_samples_per_second(loader):
    start = time.perf_counter()
    samples = 0
    for inputs, _ in loader:
        samples += inputs.shape[0]
    return samples / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workers", default="0,2")
    args = parser.parse_args()

    dataset = AugmentedFashionMnist(args.data)
    print(f"pytorch DataLoader: Fashion-MNIST train, batch 128, per-sample transforms, {args.reps} epochs each")
    for workers in [int(w) for w in args.workers.split(",")]:
        loader = DataLoader(dataset, batch_size=128, shuffle=True, drop_last=True, num_workers=workers,
                            persistent_workers=workers > 0)
        epoch_samples_per_second(loader)  # warm-up: worker start-up is not what we compare
        rates = sorted(epoch_samples_per_second(loader) for _ in range(args.reps))
        print(f"pytorch workers={workers} samples/s median={statistics.median(rates):.0f} "
              f"min={rates[0]:.0f} max={rates[-1]:.0f}")


if __name__ == "__main__":
    main()
