"""afterburner.data against Python references: every sample once per epoch, the same batches
for any worker count and on a second run, new orders per epoch, transforms equal to the
per-sample torch computation, the IDX reader equal to a Python one, and errors."""
import csv
import gzip
import struct
import threading
import time
from pathlib import Path

import numpy
import pytest
import torch
import torch.nn.functional as F

from afterburner import data

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def images_and_ids(n=203):
    """uint8 images whose target is their own index, so a batch says which samples it holds."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 2, 9, 8), dtype=torch.uint8, generator=generator), torch.arange(n)


def epoch(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


@pytest.mark.parametrize("drop_last", [False, True])
def test_an_epoch_holds_every_sample_once_in_a_new_order_each_time(drop_last):
    images, ids = images_and_ids()
    loader = data.Loader(images, ids, batch_size=16, drop_last=drop_last, workers=2)
    assert len(loader) == (203 // 16 if drop_last else -(-203 // 16))
    first, second = epoch(loader), epoch(loader)
    assert loader._loader.next() == [] and loader._loader.next() == []  # past the end, and again
    for batches in (first, second):
        seen = torch.cat([y for _, y in batches])
        assert len(seen) == (len(loader) * 16 if drop_last else 203)
        assert len(set(seen.tolist())) == len(seen)
        for x, y in batches:
            assert y.dtype == torch.int64 and torch.equal(x, images[y])  # stored dtype, no transform
    assert not torch.equal(torch.cat([y for _, y in first]), torch.cat([y for _, y in second]))


def test_batches_depend_on_seed_and_epoch_only():
    images, ids = images_and_ids()
    options = dict(batch_size=32, scale=1 / 255, mean=[0.5, 0.25], std=[0.2, 0.3], random_crop=2,
                   horizontal_flip=0.5, seed=3)
    reference = data.Loader(images, ids, workers=0, **options)
    reference.set_epoch(4)
    expected = epoch(reference)
    for workers in (1, 2, 3):
        loader = data.Loader(images.numpy(), ids.numpy(), workers=workers, **options)  # numpy arrays too
        loader.set_epoch(4)
        for (x, y), (want_x, want_y) in zip(epoch(loader), expected):
            assert torch.equal(x, want_x) and torch.equal(y, want_y)
    other_seed = data.Loader(images, ids, workers=2, **{**options, "seed": 4})
    other_seed.set_epoch(4)
    assert not torch.equal(epoch(other_seed)[0][1], expected[0][1])


def test_transforms_equal_torch_per_sample():
    images, ids = images_and_ids()
    mean, std = [0.5, 0.25], [0.2, 0.3]
    plain = data.Loader(images, ids, batch_size=50, scale=1 / 255, mean=mean, std=std, drop_last=False)
    for x, y in plain:
        expected = (images[y].double() / 255 - torch.tensor(mean).view(2, 1, 1)) / torch.tensor(std).view(2, 1, 1)
        assert x.dtype == torch.float32
        torch.testing.assert_close(x.double(), expected, rtol=1e-5, atol=1e-5)
    cropped = data.Loader(images, ids, batch_size=50, scale=1 / 255, random_crop=2, drop_last=False)
    for x, y in cropped:
        padded = F.pad(images[y].float() / 255, (2, 2, 2, 2))
        for sample, source in zip(x, padded):  # some 9 x 8 window of the zero-padded image
            windows = [source[:, i:i + 9, j:j + 8] for i in range(5) for j in range(5)]
            assert any(torch.allclose(sample, w, atol=1e-6) for w in windows)


def test_waiting_for_a_batch_lets_other_python_threads_run():
    """While the loader waits for a slow batch, a second Python thread keeps running: the
    longest pause it sees stays far below the batch's build time (holding the GIL through the
    wait would pause it for all of it)."""
    images = torch.zeros(8192, 1, 96, 96, dtype=torch.uint8)
    loader = data.Loader(images, torch.zeros(8192, dtype=torch.int64), batch_size=8192, workers=1, scale=1 / 255,
                         mean=[0.5], std=[0.5], random_crop=4)
    longest_pause, stop = [0.0], threading.Event()

    def count():
        last = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            longest_pause[0] = max(longest_pause[0], now - last)
            last = now

    counter = threading.Thread(target=count)
    counter.start()
    try:
        start = time.perf_counter()
        batches = iter(loader)
        next(batches)  # waits for the whole first batch to be built
        build_seconds = time.perf_counter() - start
    finally:
        stop.set()
        counter.join()
    assert build_seconds > 0.05, "the batch was too quick to tell"
    assert longest_pause[0] < build_seconds / 2, f"paused {longest_pause[0]:.3f} s of a {build_seconds:.3f} s wait"


def python_read_idx(path):
    with gzip.open(path, "rb") as f:
        magic = struct.unpack(">I", f.read(4))[0]
        dims = [struct.unpack(">I", f.read(4))[0] for _ in range(magic & 0xFF)]
        return torch.from_numpy(numpy.frombuffer(f.read(), dtype=numpy.uint8).reshape(dims).copy())


@pytest.mark.skipif(not FASHION_MNIST.exists(), reason="dataset-fashion-mnist is installed by install-deps")
def test_mnist_readers_match_a_python_reader():
    images, labels = data.load_mnist(str(FASHION_MNIST), "test")
    assert images.shape == (10000, 1, 28, 28) and images.dtype == torch.uint8 and labels.dtype == torch.int64
    expected = python_read_idx(FASHION_MNIST / "t10k-images-idx3-ubyte.gz")
    assert torch.equal(images[:, 0], expected)
    assert torch.equal(data.read_idx(str(FASHION_MNIST / "t10k-labels-idx1-ubyte.gz")).long(), labels)


def python_read_csv(path, label_column, delimiter):
    """The same file through Python's csv module: features and labels."""
    with open(path, newline="") as f:
        rows = [row for row in csv.reader(f, delimiter=delimiter) if row][1:]
    labels = torch.tensor([int(row[label_column]) for row in rows])
    features = [[float(cell) for i, cell in enumerate(row) if i != label_column % len(row)] for row in rows]
    return torch.tensor(features, dtype=torch.float32), labels


@pytest.mark.parametrize("delimiter,label", [(",", dict(label_name="species")), ("\t", dict(label_column=1))])
def test_csv_reader_matches_pythons_csv_module(tmp_path, delimiter, label):
    rng = numpy.random.default_rng(5)
    rows = [[f"{v:.6g}" for v in rng.normal(size=4)] for _ in range(37)]
    for row in rows:
        row.insert(1, str(int(rng.integers(0, 3))))
    rows[4][0] = f'"{rows[4][0]}"'  # quoted cells are read as their number
    path = tmp_path / "iris.csv"
    lines = [delimiter.join(["sepal", "species", "petal", "width", "length"])] + [delimiter.join(r) for r in rows]
    path.write_text("\n".join(lines[:10] + [""] + lines[10:]) + "\n")  # a blank line is skipped
    features, labels = data.read_csv(path, delimiter=delimiter, classes=3, **label)
    expected_features, expected_labels = python_read_csv(path, 1, delimiter)
    assert features.dtype == torch.float32 and labels.dtype == torch.int64 and features.shape == (37, 4)
    assert torch.equal(features, expected_features) and torch.equal(labels, expected_labels)
    batches = list(data.Loader(features, labels, batch_size=8, shuffle=False, drop_last=False))
    assert torch.equal(torch.cat([x for x, _ in batches]), features)
    with pytest.raises(RuntimeError, match=f"{path}:[0-9]+:2: label 2 is outside the model's 2 classes"):
        data.read_csv(path, delimiter=delimiter, classes=2, **label)


def test_bad_input_is_one_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="split: expected train or test"):
        data.load_mnist(str(FASHION_MNIST), "validation")
    with pytest.raises(RuntimeError, match=str(tmp_path / "missing.idx")):
        data.read_idx(str(tmp_path / "missing.idx"))
    bad_cell = tmp_path / "bad.csv"
    bad_cell.write_text("a,b,label\n1,2,0\n1.5,abc,1\n")
    with pytest.raises(RuntimeError, match=f"{bad_cell}:3:2: expected a number, got 'abc'"):
        data.read_csv(bad_cell)
    with pytest.raises(RuntimeError, match="delimiter: expected one character"):
        data.read_csv(bad_cell, delimiter=", ")
    with pytest.raises(RuntimeError, match="targets"):
        data.Loader(torch.zeros(5, 3), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="mean and std together"):
        data.Loader(torch.zeros(5, 3), torch.zeros(5, dtype=torch.int64), mean=[0.5])
