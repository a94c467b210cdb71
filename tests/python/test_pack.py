"""Packs (.abpk, data/pack.h) against the image folders they hold: records equal the files'
pixels (raw) or torchvision's resize of them (max_side), the loader's batches from a pack equal
its folder's, packing resumes after a failure to the same bytes, and damage is one line naming
the pack or record."""
import io
import json
import subprocess

import numpy
import pytest
import torch
import torchvision.transforms.functional as TF
from PIL import Image

from afterburner import data
from served import BINARY


def write_folder(root, count, seed=0):
    """Photograph-like JPEGs and PNGs of several sizes, two classes told apart by stripes."""
    generator = numpy.random.default_rng(seed)
    for index in range(count):
        label = "stripes" if index % 2 else "waves"
        height, width = 40 + index % 5 * 13, 50 + index % 3 * 17
        y, x = numpy.mgrid[0:height, 0:width]
        pixels = numpy.stack([numpy.sin(x / (3 + index % 4)) * 120 + 128, y * 2 % 255, (x + y + index) % 255], -1)
        pixels = (pixels + generator.normal(0, 3, pixels.shape)).clip(0, 255).astype(numpy.uint8)
        if index % 2:
            pixels[::4] = 255 - pixels[::4]
        path = root / label / f"{index:03d}.{'png' if index % 3 == 0 else 'jpg'}"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path, **({} if path.suffix == ".png" else {"quality": 90}))
    return root


def pil_jpeg(image, quality):
    """uint8 [C, H, W] through PIL's JPEG encoder and decoder."""
    buffer = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).squeeze(-1).numpy()).save(buffer, format="JPEG", quality=quality)
    return TF.pil_to_tensor(Image.open(buffer))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("pack")
    write_folder(root / "set" / "train", 40)
    write_folder(root / "set" / "val", 12, seed=1)
    return root


def test_records_hold_the_files_pixels_or_torchvisions_resize_of_them(folder):
    source = folder / "set" / "train"
    files = [data.decode_image(path) for path in torch.ops.afterburner.list_image_folder(str(source), None)[0]]
    _, expected_labels, expected_classes = torch.ops.afterburner.list_image_folder(str(source), None)
    for name, options in (("stored", {}), ("raw", {"raw": True}), ("fitted", {"raw": True, "max_side": 48}),
                          ("jpeg", {"max_side": 48, "quality": 95})):
        output = folder / f"{name}.abpk"
        summary = data.pack(source, output, **options)
        assert (summary["records"], summary["resumed"], summary["skipped"]) == (40, 0, [])
        assert summary["bytes"] == output.stat().st_size
        for _ in range(2):  # a second read gives the same answer
            images, labels, classes = data.read_pack(output)
            assert classes == expected_classes and labels.tolist() == expected_labels
            for image, file in zip(images, files):
                side = max(file.shape[1:])
                fitted = [round(s * 48 / side) for s in file.shape[1:]] if "max_side" in options else file.shape[1:]
                assert list(image.shape[1:]) == list(fitted), name
                reference = file if fitted == file.shape[1:] else TF.resize(file, fitted, antialias=True)
                if name == "jpeg":  # re-encoded as PIL encodes (libjpeg's defaults, 4:2:0 chroma)
                    assert torch.equal(image, pil_jpeg(reference, 95)), name
                else:
                    assert torch.equal(image, reference), name


def loader_batches(root, batch_size=8, **options):
    loader = data.ImageFolder(root, size=24, batch_size=batch_size, workers=2, seed=3, mean=[0.5] * 3, std=[0.25] * 3,
                              **options)
    return [(x.clone(), y.clone()) for _ in range(2) for x, y in loader]


def test_a_packs_batches_equal_its_folders(folder):
    data.pack(folder / "set" / "train", folder / "train.abpk")
    pack = data.ImageFolder(folder / "train.abpk", size=24, batch_size=8)
    files = data.ImageFolder(folder / "set" / "train", size=24, batch_size=8)
    assert pack.classes == files.classes and list(pack.targets) == list(files.targets)
    for train, batch_size in ((True, 8), (False, 8), (True, 1)):
        from_folder = loader_batches(folder / "set" / "train", batch_size, train=train)
        from_pack = loader_batches(folder / "train.abpk", batch_size, train=train)
        assert len(from_pack) == len(from_folder) > 0
        for (x, y), (x_folder, y_folder) in zip(from_pack, from_folder):
            assert torch.equal(x, x_folder) and torch.equal(y, y_folder)


def test_a_large_packs_order_is_block_local(tmp_path):
    """ImageFolder over a pack of 3 blocks (raw 64x64 records, 341 to a 4 MiB block): block-local
    when asked (auto: only for a pack larger than half the memory), every sample once, in another
    order than the full shuffle (the order's block structure: tests/data/loader_test.cpp)."""
    source = tmp_path / "set"
    pixels = numpy.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=numpy.uint8)
    for index in range(700):
        path = source / ("a" if index % 2 else "b") / f"{index:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(numpy.roll(pixels, index, axis=1)).save(path, compress_level=0)
    data.pack(source, tmp_path / "raw.abpk", raw=True)
    orders = {}
    for order in ("exact", "block-local"):
        loader = data.ImageFolder(tmp_path / "raw.abpk", size=8, batch_size=50, workers=2, order=order)
        assert loader.order == order
        batches = [y for _, y in loader]
        assert sum(len(y) for y in batches) == 700
        orders[order] = torch.cat(batches)
    assert data.ImageFolder(tmp_path / "raw.abpk", size=8, batch_size=50).order == "exact"  # it fits in memory
    assert sorted(orders["exact"].tolist()) == sorted(orders["block-local"].tolist())
    assert not torch.equal(orders["exact"], orders["block-local"])
    with pytest.raises(ValueError, match="block-local"):
        data.ImageFolder(source, size=8, order="block-local")


def test_packing_resumes_after_a_failure_to_the_same_bytes(folder, tmp_path):
    source = write_folder(tmp_path / "big", 150)
    whole = tmp_path / "whole.abpk"
    data.pack(source, whole, max_side=40)
    # A corrupt file in the third chunk of 64 stops the run; the chunks before it stay packed.
    victim = sorted((source / "waves").iterdir())[-2]
    original = victim.read_bytes()
    victim.write_bytes(original[:len(original) // 2])
    resumed = tmp_path / "resumed.abpk"
    with pytest.raises(RuntimeError, match=str(victim)):
        data.pack(source, resumed, max_side=40)
    partial = tmp_path / "resumed.abpk.partial"
    assert partial.exists() and not resumed.exists()
    named = partial.rename(tmp_path / "partial.abpk")
    with pytest.raises(RuntimeError, match="unfinished pack"):
        data.read_pack(named)
    named.rename(partial)
    # A run killed while writing a record leaves it cut short: resuming drops it.
    with open(partial, "r+b") as file:
        file.truncate(partial.stat().st_size - 100)
    victim.write_bytes(original)
    summary = data.pack(source, resumed, max_side=40)
    assert 0 < summary["resumed"] < 150 and summary["records"] == 150
    assert resumed.read_bytes() == whole.read_bytes()
    # Other options do not resume another run's records.
    victim.write_bytes(original[:len(original) // 2])
    with pytest.raises(RuntimeError):
        data.pack(source, tmp_path / "other.abpk", max_side=40)
    victim.write_bytes(original)
    assert data.pack(source, tmp_path / "other.abpk", max_side=41)["resumed"] == 0


def test_a_damaged_pack_is_one_line_naming_it(folder, tmp_path):
    data.pack(folder / "set" / "val", tmp_path / "good.abpk", raw=True)
    good = (tmp_path / "good.abpk").read_bytes()

    def damaged(name, content, *fragments):
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(RuntimeError) as error:
            data.read_pack(path)
        message = str(error.value).splitlines()[0]
        assert str(path) in message and all(fragment in message for fragment in fragments), message

    damaged("cut.abpk", good[:-10], "cut short")
    damaged("tiny.abpk", good[:100], "shorter than its header page")
    damaged("other.abpk", b"PK\x03\x04" + good[4:], "not an .abpk pack")
    header = bytearray(good)
    header[20] ^= 1
    damaged("header.abpk", bytes(header), "header fails its CRC-32")
    payload = bytearray(good)
    payload[4096 + 32 + 5] ^= 1
    damaged("payload.abpk", bytes(payload), "record 0", "CRC-32")
    with pytest.raises(RuntimeError, match="no such file"):
        data.read_pack(tmp_path / "missing.abpk")


@pytest.mark.skipif(not BINARY, reason="AFTERBURNER_BINARY is set by ctest")
def test_train_reads_packs_as_their_folders(folder, tmp_path):
    def run(*argv):
        return subprocess.run([BINARY, *map(str, argv)], capture_output=True, text=True)

    for split, extra in (("train", []), ("val", ["--classes-from", tmp_path / "train.abpk"])):
        packed = run("data", "pack", folder / "set" / split, "-o", tmp_path / f"{split}.abpk", *extra)
        assert packed.returncode == 0 and f"{split}.abpk" in packed.stdout, packed.stderr
    outcomes = []
    for argv, format in ((["--data", folder / "set", "--decode", "each-epoch"], "folder"),
                         (["--data", tmp_path / "train.abpk", "--val-data", tmp_path / "val.abpk"],
                          "pack (as stored)")):
        report = tmp_path / "report.json"
        trained = run("train", *argv, "--image-size", "24", "--epochs", "2", "--batch-size", "8", "--workers", "2",
                      "--report", report)
        assert trained.returncode == 0, trained.stderr
        described = json.loads(report.read_text())
        assert described["data"]["format"] == format
        outcomes.append([(e["accuracy"], e["loss"]) for e in described["evaluations"]])
    assert outcomes[1] == outcomes[0] and len(outcomes[0]) == 2
    orders = {}
    for shuffle in ("auto", "block-local"):
        report = tmp_path / f"{shuffle}.json"
        trained = run("train", "--data", tmp_path / "train.abpk", "--val-data", tmp_path / "val.abpk", "--image-size",
                      "24", "--max-steps", "3", "--batch-size", "8", "--shuffle", shuffle, "--report", report)
        assert trained.returncode == 0, trained.stderr
        orders[shuffle] = json.loads(report.read_text())["data"]["order"]
    assert orders == {"auto": "exact shuffle",  # a pack this small fits in memory
                      "block-local": "block-local shuffle: 16 blocks of 4 MiB at a time, samples shuffled within"}
    refused = run("train", "--data", folder / "set", "--shuffle", "block-local", "--max-steps", "1")
    assert refused.returncode == 2 and "--shuffle" in refused.stderr, refused.stderr
    refused = run("train", "--data", tmp_path / "train.abpk", "--max-steps", "1")
    assert refused.returncode == 2 and "--val-data" in refused.stderr and len(refused.stderr.splitlines()) == 1
    write_folder(tmp_path / "three" / "zebra", 2)
    mismatch = run("data", "pack", tmp_path / "three", "-o", tmp_path / "three.abpk")
    assert mismatch.returncode == 0, mismatch.stderr
    refused = run("train", "--data", tmp_path / "train.abpk", "--val-data", tmp_path / "three.abpk", "--max-steps", "1")
    assert refused.returncode == 1 and "--classes-from" in refused.stderr, refused.stderr
