"""Users' datasets in every format `afterburner train --data` reads, against independent readers:
Fashion-MNIST written as IDX files, a folder of PNGs per class, CIFAR-style binary batches, an .npz
archive, a folder of .npy arrays and Kaggle's CSV layout loads to the IDX tensors bit for bit and
trains to the same accuracy; tables of features load and train as numpy reads them; JPEG and PNG decoding equals PIL's; resizing equals torchvision's; bad input is one line."""
import gzip
import json
import os
import struct
import subprocess
from pathlib import Path

import numpy
import pytest
import torch
import torchvision.transforms.functional as TF
from PIL import Image

from afterburner import data
from served import BINARY

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
TRAIN, TEST = 1200, 300  # per split: enough to learn something in a few dozen steps


def idx_array(name):
    path = FASHION_MNIST / name
    raw = path.read_bytes() if path.exists() else gzip.open(f"{path}.gz").read()
    dims = struct.unpack(f">{raw[3]}I", raw[4:4 + 4 * raw[3]])
    return numpy.frombuffer(raw, numpy.uint8, offset=4 + 4 * raw[3]).reshape(dims)


def write_idx(path, array):
    path.write_bytes(struct.pack(f">HBB{array.ndim}I", 0, 0x08, array.ndim, *array.shape) + array.tobytes())


def cifar_records(images, labels):
    """CIFAR-10's records: a label byte, then 3 planes of 32x32 (the 28x28 image padded, repeated)."""
    planes = numpy.repeat(numpy.pad(images, ((0, 0), (2, 2), (2, 2)))[:, None], 3, axis=1)
    return numpy.concatenate([labels[:, None], planes.reshape(len(images), -1)], axis=1).astype(numpy.uint8)


def write_pixel_csv(path, images, labels):
    """Kaggle's layout of the MNIST family: a header, then the label and the pixels row by row."""
    pixels = images.reshape(len(images), -1)
    header = "label," + ",".join(f"pixel{i + 1}" for i in range(pixels.shape[1]))
    rows = [",".join(map(str, [label, *row])) for label, row in zip(labels, pixels)]
    path.write_text("\n".join([header, *rows]) + "\n")


@pytest.fixture(scope="module")
def formats(tmp_path_factory):
    """The first TRAIN and TEST Fashion-MNIST items, each split in label order (so that a folder per
    class holds them in the same order), in every format: {format: path}, and the arrays."""
    root = tmp_path_factory.mktemp("formats")
    splits = {}
    for split, prefix, count in (("train", "train", TRAIN), ("test", "t10k", TEST)):
        images = idx_array(f"{prefix}-images-idx3-ubyte")[:count]
        labels = idx_array(f"{prefix}-labels-idx1-ubyte")[:count]
        order = numpy.argsort(labels, kind="stable")
        splits[split] = images[order], labels[order]
    (root / "idx").mkdir()
    (root / "cifar").mkdir()
    (root / "npy").mkdir()
    (root / "csv").mkdir()
    for split, (images, labels) in splits.items():
        prefix = "train" if split == "train" else "t10k"
        write_idx(root / "idx" / f"{prefix}-images-idx3-ubyte", images)
        write_idx(root / "idx" / f"{prefix}-labels-idx1-ubyte", labels)
        folder = "train" if split == "train" else "val"
        for index, (image, label) in enumerate(zip(images, labels)):
            directory = root / "folder" / folder / f"class{label}"
            directory.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(directory / f"{index:05d}.png")
        name = "data_batch_1.bin" if split == "train" else "test_batch.bin"
        cifar_records(images, labels).tofile(root / "cifar" / name)
        numpy.save(root / "npy" / f"x_{split}.npy", images[..., None])  # NHWC
        numpy.save(root / "npy" / f"y_{split}.npy", labels.astype(numpy.int64))
        write_pixel_csv(root / "csv" / f"fashion-mnist_{split}.csv", images, labels)
    numpy.savez_compressed(root / "fmnist.npz", x_train=splits["train"][0], y_train=splits["train"][1],
                           x_test=splits["test"][0], y_test=splits["test"][1])
    paths = {"idx": root / "idx", "folder": root / "folder", "cifar": root / "cifar", "npy": root / "npy",
             "npz": root / "fmnist.npz", "csv": root / "csv"}
    return paths, splits


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("name", ["idx", "folder", "npy", "npz", "csv"])
def test_every_format_loads_the_idx_images_bit_for_bit(formats, name, split):
    paths, splits = formats
    images, labels, classes = data.load_images(paths[name], split=split)
    expected_images, expected_labels = splits[split]
    assert images.dtype == torch.uint8 and images.shape == (len(expected_images), 1, 28, 28)
    assert torch.equal(images[:, 0], torch.from_numpy(expected_images.copy()))
    assert torch.equal(labels, torch.from_numpy(expected_labels.astype(numpy.int64)))
    assert classes == ([f"class{i}" for i in range(10)] if name == "folder" else [str(i) for i in range(10)])
    again = data.load_images(paths[name], split=split)  # a second call gives the same answer
    assert torch.equal(again[0], images) and torch.equal(again[1], labels)


def test_cifar_batches_hold_the_padded_images(formats):
    paths, splits = formats
    for split in ("train", "test"):
        images, labels, classes = data.load_images(paths["cifar"], split=split)
        expected = numpy.pad(splits[split][0], ((0, 0), (2, 2), (2, 2)))
        assert images.shape == (len(expected), 3, 32, 32) and classes == [str(i) for i in range(10)]
        for channel in range(3):
            assert torch.equal(images[:, channel], torch.from_numpy(expected))
        assert torch.equal(labels, torch.from_numpy(splits[split][1].astype(numpy.int64)))
    (paths["cifar"] / "batches.meta.txt").write_text("".join(f"name {i}\n" for i in range(10)) + "\n")
    assert data.load_images(paths["cifar"])[2] == [f"name {i}" for i in range(10)]
    (paths["cifar"] / "batches.meta.txt").unlink()


def train_report(path, tmp_path, *flags, length=("--epochs", "1", "--max-steps", "30", "--batch-size", "64")):
    report = tmp_path / f"report-{path.name}.json"
    run = subprocess.run([BINARY, "train", "--data", str(path), *length, "--threads", "2", "--report", str(report),
                          *flags], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return json.loads(report.read_text())


@pytest.mark.skipif(not BINARY, reason="AFTERBURNER_BINARY is set by ctest")
def test_training_on_each_format_matches_the_idx_run(formats, tmp_path):
    paths, _ = formats
    reference = train_report(paths["idx"], tmp_path)
    assert reference["test_accuracy"] > 0.3  # it learnt: ten classes, 30 steps
    for name in ("folder", "npy", "npz", "csv"):
        report = train_report(paths[name], tmp_path)
        assert report["test_accuracy"] == reference["test_accuracy"], name
        assert report["evaluations"][-1]["loss"] == reference["evaluations"][-1]["loss"], name
        described = report["data"]
        assert (described["train_samples"], described["evaluation_samples"], described["sample"]) == (TRAIN, TEST,
                                                                                                    [1, 28, 28])
        assert described["mean"] == reference["data"]["mean"] and described["std"] == reference["data"]["std"]
        assert described["classes"] == ([f"class{i}" for i in range(10)] if name == "folder" else
                                        [str(i) for i in range(10)])


def smooth_image(height, width, channels, seed):
    """Photograph-like pixels (JPEG's 8x8 blocks see gradients, not noise)."""
    generator = numpy.random.default_rng(seed)
    y, x = numpy.mgrid[0:height, 0:width]
    planes = [127 + 100 * numpy.sin(x / (5 + c) + y / (7 + 2 * c) + generator.random() * 6) for c in range(channels)]
    return numpy.clip(numpy.stack(planes, -1) + generator.normal(0, 8, (height, width, channels)), 0, 255).astype(
        numpy.uint8)


@pytest.mark.parametrize("size", [(1, 1), (17, 9), (64, 48)])
def test_jpeg_decoding_equals_pils(tmp_path, size):
    height, width = size
    for index, (mode, subsampling) in enumerate((("RGB", 0), ("RGB", 1), ("RGB", 2), ("L", -1))):
        pixels = smooth_image(height, width, 3 if mode == "RGB" else 1, index)
        path = tmp_path / f"{mode}-{subsampling}.jpg"
        image = Image.fromarray(pixels if mode == "RGB" else pixels[..., 0], mode)
        image.save(path, quality=85, **({"subsampling": subsampling} if subsampling >= 0 else {}))
        reference = numpy.asarray(Image.open(path).convert(mode))
        decoded = data.decode_image(path)
        expected = reference.transpose(2, 0, 1) if mode == "RGB" else reference[None]
        assert decoded.dtype == torch.uint8 and torch.equal(decoded, torch.from_numpy(expected.copy())), path.name


def test_png_kinds_decode_as_documented(tmp_path):
    rgba = smooth_image(7, 5, 4, 0)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "rgba.png")
    assert torch.equal(data.decode_image(tmp_path / "rgba.png"), torch.from_numpy(rgba[..., :3].transpose(2, 0, 1).copy()))
    gray_alpha = smooth_image(6, 6, 2, 1)
    Image.fromarray(gray_alpha, "LA").save(tmp_path / "la.png")
    assert torch.equal(data.decode_image(tmp_path / "la.png"), torch.from_numpy(gray_alpha[None, ..., 0].copy()))
    palette = Image.fromarray(smooth_image(9, 4, 3, 2), "RGB").convert("P")
    palette.save(tmp_path / "palette.png")
    expected = numpy.asarray(Image.open(tmp_path / "palette.png").convert("RGB")).transpose(2, 0, 1)
    assert torch.equal(data.decode_image(tmp_path / "palette.png"), torch.from_numpy(expected.copy()))
    deep = numpy.random.default_rng(3).integers(0, 65536, (5, 8), dtype=numpy.uint16)
    Image.fromarray(deep).save(tmp_path / "gray16.png")  # PIL writes I;16 as a 16-bit grayscale PNG
    rounded = (deep.astype(numpy.uint32) * 255 + 32767) // 65535
    assert torch.equal(data.decode_image(tmp_path / "gray16.png"), torch.from_numpy(rounded.astype(numpy.uint8)[None]))
    bilevel = numpy.random.default_rng(4).integers(0, 2, (6, 10), dtype=numpy.uint8).astype(bool)
    Image.fromarray(bilevel).save(tmp_path / "bits.png")
    expected = numpy.asarray(Image.open(tmp_path / "bits.png").convert("L"))
    assert torch.equal(data.decode_image(tmp_path / "bits.png"), torch.from_numpy(expected[None].copy()))


def test_a_folder_of_mixed_sizes_and_colours_is_resized_as_torchvision(tmp_path):
    shapes = {"a": [(40, 30, 3), (30, 41, 1)], "b": [(32, 32, 3), (25, 60, 3), (33, 33, 1)]}
    expected, labels = [], []
    for label, (name, images) in enumerate(shapes.items()):
        (tmp_path / "set" / name).mkdir(parents=True)
        for index, (height, width, channels) in enumerate(images):
            pixels = smooth_image(height, width, channels, 10 * label + index)
            Image.fromarray(pixels if channels == 3 else pixels[..., 0]).save(tmp_path / "set" / name / f"{index}.png")
            tensor = torch.from_numpy(pixels.transpose(2, 0, 1).copy()).expand(3, -1, -1)
            expected.append(TF.center_crop(TF.resize(tensor, 24, antialias=True), 24))
            labels.append(label)
    images, got_labels, classes = data.load_images(tmp_path / "set", image_size=24)
    assert classes == ["a", "b"] and got_labels.tolist() == labels
    assert torch.equal(images, torch.stack(expected))
    one_line_error(lambda: data.load_images(tmp_path / "set"), "0.png: 30x40 pixels, not square", "--image-size")
    for path in (tmp_path / "set" / "a").iterdir():
        path.unlink()
    Image.fromarray(smooth_image(20, 20, 3, 0)).save(tmp_path / "set" / "a" / "0.png")
    one_line_error(lambda: data.load_images(tmp_path / "set"), "b/0.png: 32x32 pixels", "a/0.png 20x20")


def write_bytes(path, content):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def one_line_error(call, *fragments):
    with pytest.raises(RuntimeError) as error:
        call()
    message = str(error.value).splitlines()[0]
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_bad_input_is_one_line_naming_the_file(tmp_path):
    Image.fromarray(smooth_image(16, 16, 3, 0)).save(tmp_path / "good.jpg")
    jpeg = (tmp_path / "good.jpg").read_bytes()
    png_buffer = tmp_path / "good.png"
    Image.fromarray(smooth_image(16, 16, 3, 1)).save(png_buffer)
    png = png_buffer.read_bytes()
    cases = {
        "truncated.jpg": (jpeg[:len(jpeg) // 2], "corrupt JPEG"),
        "truncated.png": (png[:len(png) - 20], "corrupt PNG"),
        "text.jpg": (b"just some text\n", "not a JPEG or PNG image"),
        "empty.png": (b"", "not a JPEG or PNG image"),
    }
    for name, (content, problem) in cases.items():
        path = write_bytes(tmp_path / name, content)
        one_line_error(lambda: data.decode_image(path), str(path), problem)
    Image.fromarray(smooth_image(8, 8, 4, 2), "CMYK").save(tmp_path / "cmyk.jpg")
    one_line_error(lambda: data.decode_image(tmp_path / "cmyk.jpg"), "cmyk.jpg", "CMYK")

    write_bytes(tmp_path / "set" / "a" / "x.png", png)
    (tmp_path / "set" / "b").mkdir()
    write_bytes(tmp_path / "set" / "b" / "notes.txt", b"not an image: skipped, as ImageFolder skips it")
    one_line_error(lambda: data.load_images(tmp_path / "set"), str(tmp_path / "set" / "b"), "no JPEG or PNG")
    write_bytes(tmp_path / "set" / "b" / "y.bmp", b"BM")
    one_line_error(lambda: data.load_images(tmp_path / "set"), "y.bmp", "convert it to PNG")
    (tmp_path / "set" / "b" / "y.bmp").unlink()
    write_bytes(tmp_path / "set" / "b" / "y.png", png[:40])
    one_line_error(lambda: data.load_images(tmp_path / "set"), "y.png", "corrupt PNG")
    one_line_error(lambda: data.load_images(tmp_path / "set", split="test", classes=["a"]), "b", "a class the training")

    (tmp_path / "arrays").mkdir()
    numpy.save(tmp_path / "arrays" / "x_train.npy", numpy.zeros((2, 4, 4), numpy.float32))
    numpy.save(tmp_path / "arrays" / "y_train.npy", numpy.zeros(2, numpy.int64))
    one_line_error(lambda: data.load_images(tmp_path / "arrays"), "x_train.npy", "uint8")
    numpy.save(tmp_path / "arrays" / "x_train.npy", numpy.zeros((3, 4, 4), numpy.uint8))
    one_line_error(lambda: data.load_images(tmp_path / "arrays"), "y_train.npy", "2 labels for 3 images")
    numpy.savez(tmp_path / "partial.npz", x_train=numpy.zeros((2, 4, 4), numpy.uint8))
    one_line_error(lambda: data.load_images(tmp_path / "partial.npz"), "partial.npz", "no array 'y_train'")
    whole = (tmp_path / "arrays" / "y_train.npy").read_bytes()
    write_bytes(tmp_path / "cut.npy", whole[:-3])
    one_line_error(lambda: data.read_npy(tmp_path / "cut.npy"), "cut.npy", "truncated data")

    write_bytes(tmp_path / "cifar" / "data_batch_1.bin", bytes(3073 * 2 + 5))
    one_line_error(lambda: data.load_images(tmp_path / "cifar"), "data_batch_1.bin", "whole number of 3073-byte")
    write_bytes(tmp_path / "cifar" / "data_batch_1.bin", bytes([12]) + bytes(3072))
    one_line_error(lambda: data.load_images(tmp_path / "cifar"), "data_batch_1.bin", "label 12")
    one_line_error(lambda: data.load_images(tmp_path / "nowhere"), "nowhere", "no such file or folder")
    one_line_error(lambda: data.load_images(tmp_path / "set", format="tiff"), "--data-format", "tiff")


@pytest.mark.skipif(not BINARY, reason="AFTERBURNER_BINARY is set by ctest")
def test_the_cli_asks_for_an_evaluation_set_and_names_bad_data(formats, tmp_path):
    paths, _ = formats
    for argv, fragments in (
            (["--data", str(paths["folder"] / "train")], ["--val-data", "--validation-split"]),
            (["--data", str(paths["idx"]), "--image-size", "32"], ["--image-size", "resizing applies to image folders"]),
            (["--data", str(tmp_path)], [str(tmp_path), "no dataset found"])):
        run = subprocess.run([BINARY, "train", *argv, "--max-steps", "1"], capture_output=True, text=True)
        assert run.returncode != 0 and len(run.stderr.strip().splitlines()) == 1, run.stderr
        for fragment in fragments:
            assert fragment in run.stderr, run.stderr
    report = train_report(paths["folder"] / "train", tmp_path, "--val-data", str(paths["folder"] / "val"))
    assert report["test_accuracy"] == train_report(paths["folder"], tmp_path)["test_accuracy"]


@pytest.mark.parametrize("box,size", [((0, 0, 40, 30), 16), ((5, 3, 23, 27), 24), ((7, 2, 11, 9), 32), ((0, 0, 40, 30), 1)])
def test_the_pipelines_resampling_equals_torchvisions_resized_crop(box, size):
    image = torch.from_numpy(smooth_image(30, 40, 3, 5).transpose(2, 0, 1).copy())
    x, y, width, height = box
    ours = data.resample_box(image, x, y, width, height, size)
    reference = TF.resized_crop(image.float(), y, x, height, width, [size, size], antialias=True)
    assert ours.shape == (3, size, size) and (ours - reference).abs().max() < 2e-3


def test_image_folder_batches_are_the_centre_box_in_evaluation_and_random_crops_in_training(tmp_path):
    sizes = {"a": [(300, 220), (180, 260)], "b": [(256, 256), (120, 400), (333, 333)]}
    for name, shapes in sizes.items():
        (tmp_path / name).mkdir()
        for index, (height, width) in enumerate(shapes):
            Image.fromarray(smooth_image(height, width, 3, index)).save(tmp_path / name / f"{index}.jpg", quality=95)
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    folder = data.ImageFolder(tmp_path, size=64, train=False, batch_size=5, mean=mean, std=std, workers=0,
                              reduced_decode=False)
    assert folder.classes == ["a", "b"] and folder.targets == [0, 0, 1, 1, 1] and len(folder) == 1
    (images, labels), = list(folder)
    assert images.shape == (5, 3, 64, 64) and labels.tolist() == folder.targets
    for index, path in enumerate(folder.samples):  # torchvision's Resize(64 * 256 // 224) + CenterCrop(64)
        pixels = TF.center_crop(TF.resize(data.decode_image(path).float(), 73, antialias=True), [64, 64])
        expected = (pixels / 255 - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
        assert (images[index] - expected).abs().max() < 1e-4, path
    singles = data.ImageFolder(tmp_path, size=64, train=False, batch_size=1, mean=mean, std=std, workers=2,
                               reduced_decode=False)
    for _ in range(2):  # batch size 1, and a second epoch: the same images one by one
        assert torch.equal(torch.cat([x for x, _ in singles]), images)
    training = data.ImageFolder(tmp_path, size=64, batch_size=2, workers=2, seed=3)
    first, again = list(training), list(data.ImageFolder(tmp_path, size=64, batch_size=2, workers=0, seed=3))
    assert len(first) == 2 and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    second = list(training)  # the next epoch: other crops
    assert not torch.equal(first[0][0], second[0][0])


@pytest.mark.skipif(not BINARY, reason="AFTERBURNER_BINARY is set by ctest")
def test_train_decodes_a_jpeg_folder_each_epoch_the_same_for_any_worker_count(formats, tmp_path):
    for split, count in (("train", 48), ("val", 16)):
        for index in range(count):
            folder = tmp_path / "jpegs" / split / ("stripes" if index % 2 else "waves")
            folder.mkdir(parents=True, exist_ok=True)
            pixels = smooth_image(40 + index % 7 * 9, 50 + index % 5 * 11, 3, index)
            if index % 2:
                pixels[::4] = 255 - pixels[::4]
            Image.fromarray(pixels).save(folder / f"{index:03d}.jpg", quality=90)
    reports = []
    for workers in ("0", "2", "2"):
        report = tmp_path / "report.json"
        run = subprocess.run([BINARY, "train", "--data", str(tmp_path / "jpegs"), "--decode", "each-epoch",
                              "--image-size", "32", "--epochs", "2", "--batch-size", "8", "--workers", workers,
                              "--report", str(report)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        reports.append(json.loads(report.read_text()))
    described = reports[0]["data"]
    assert (described["train_samples"], described["evaluation_samples"], described["sample"]) == (48, 16, [3, 32, 32])
    assert described["classes"] == ["stripes", "waves"] and len(described["mean"]) == 3
    outcome = [[(e["accuracy"], e["loss"]) for e in report["evaluations"]] for report in reports]
    assert len(outcome[0]) == 2 and outcome[1] == outcome[0] and outcome[2] == outcome[0]
    for argv, fragments in ((["--data", str(formats[0]["idx"]), "--decode", "each-epoch"], ["--decode", "idx data"]),
                            (["--data", str(tmp_path / "jpegs"), "--decode", "each-epoch", "--augment"],
                             ["--augment", "at random already"])):
        run = subprocess.run([BINARY, "train", *argv, "--max-steps", "1"], capture_output=True, text=True)
        assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert all(fragment in run.stderr for fragment in fragments), run.stderr


def photo_folder(root, shapes):
    """Smooth colour JPEGs of (height, width) `shapes`, alternately in class folders a and b."""
    for index, (height, width) in enumerate(shapes):
        folder = root / ("a" if index % 2 == 0 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(smooth_image(height, width, 3, index)).save(folder / f"{index}.jpg", quality=95)
    return root


def test_a_listed_resize_and_centre_crop_is_torchvisions(tmp_path):
    root = photo_folder(tmp_path, [(60, 80), (97, 64), (50, 50), (120, 45)])
    ours = data.ImageFolder(root, transforms="resize40,crop32,flip", train=False, batch_size=4, workers=0,
                            reduced_decode=False)
    (images, _), = list(ours)
    for index, path in enumerate(ours.samples):
        pixels = data.decode_image(path)
        reference = TF.center_crop(TF.resize(pixels.float(), 40, antialias=True), [32, 32]) / 255
        assert (images[index] - reference).abs().max() < 1e-5, path  # to float rounding


def test_bf16_channels_last_batches_are_the_float_ones_rounded(tmp_path):
    root = photo_folder(tmp_path, [(60, 80), (97, 64), (50, 50), (120, 45), (33, 90)])
    settings = dict(transforms="resize36,crop32,flip", batch_size=2, workers=2, seed=4, mean=[0.5] * 3, std=[0.2] * 3)
    planes = data.ImageFolder(root, **settings)
    packed = data.ImageFolder(root, dtype=torch.bfloat16, channels_last=True, **settings)
    for _ in range(2):  # two epochs
        for (ours, labels), (reference, reference_labels) in zip(packed, planes):
            assert ours.dtype == torch.bfloat16 and ours.is_contiguous(memory_format=torch.channels_last)
            assert torch.equal(ours, reference.to(torch.bfloat16)) and torch.equal(labels, reference_labels)
    with pytest.raises(RuntimeError, match="transforms: 'blur' in 'rrc,blur': unknown"):
        data.ImageFolder(root, transforms="rrc,blur")
    with pytest.raises(ValueError, match="dtype"):
        data.ImageFolder(root, dtype=torch.float16)


@pytest.mark.skipif(not BINARY, reason="AFTERBURNER_BINARY is set by ctest")
def test_train_transforms_lists_for_folders_and_stored_images(formats, tmp_path):
    paths, _ = formats
    folder = photo_folder(tmp_path / "photos", [(40 + i % 5 * 7, 44 + i % 3 * 9) for i in range(24)])
    listed = train_report(folder, tmp_path, "--transforms", "resize36,crop32,flip", "--validation-split", "0.25",
                          length=("--epochs", "1", "--batch-size", "6"))["data"]
    assert listed["transforms"] == "resize36,crop32,flip:0.5" and listed["evaluation_transforms"] == "resize36,centre32"
    assert listed["format"] == "folder" and listed["sample"] == [3, 32, 32]  # decoded each epoch: it crops
    augmented = train_report(paths["idx"], tmp_path, "--augment")
    padded = train_report(paths["idx"], tmp_path, "--transforms", "pad2,crop")
    assert padded["data"]["transforms"] == "pad2,crop28" and augmented["data"]["transforms"] == "pad2,crop28"
    assert [(e["accuracy"], e["loss"]) for e in padded["evaluations"]] == \
        [(e["accuracy"], e["loss"]) for e in augmented["evaluations"]]
    for argv, fragments in ((["--data", str(paths["idx"]), "--transforms", "rrc28"], ["--transforms", "as they are decoded"]),
                            (["--data", str(paths["idx"]), "--transforms", "pad2,crop", "--augment"], ["--augment", "one of them"]),
                            (["--data", str(folder), "--transforms", "rrc32", "--decode", "once"], ["--decode each-epoch"]),
                            (["--data", str(folder), "--transforms", "rrc64", "--image-size", "32"], ["64-pixel crop differs"]),
                            (["--data", str(write_table(tmp_path / "table.csv", *blobs(40, 0))), "--validation-split",
                              "0.25", "--transforms", "flip"], ["--transforms", "rows of features"])):
        run = subprocess.run([BINARY, "train", *argv, "--max-steps", "1"], capture_output=True, text=True)
        assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert all(fragment in run.stderr for fragment in fragments), run.stderr


def blobs(rows, seed):
    """Three separable classes of 5 features (one of them constant), in multiples of 1/64 so that
    every reader parses them to the same float32."""
    generator = numpy.random.default_rng(seed)
    labels = generator.integers(0, 3, rows)
    features = generator.normal(size=(rows, 5)) + labels[:, None] * numpy.array([3.0, -2.0, 0.0, 1.5, 0.0])
    features[:, 2] = 7.25
    return numpy.round(features * 64) / 64, labels


def write_table(path, features, labels, delimiter=",", header=True):
    """The label in the middle, named 'Target', as exported tables often have it."""
    cells = [[*(repr(v) for v in row[:3]), str(label), *(repr(v) for v in row[3:])]
             for row, label in zip(features, labels)]
    lines = ([delimiter.join(["a", "b", "c", "Target", "d", "e"])] if header else []) + [delimiter.join(c) for c in cells]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_table_of_features_loads_as_numpy_reads_it(tmp_path):
    features, labels = blobs(40, 0)
    expected = torch.from_numpy(features.astype(numpy.float32))
    for name, delimiter, header, column in (("t.csv", ",", True, None), ("t.tsv", "\t", True, "Target"),
                                            ("semi.csv", ";", True, 3), ("bare.csv", ",", False, 3)):
        path = write_table(tmp_path / name, features, labels, delimiter, header)
        for _ in range(2):  # a second call gives the same answer
            loaded, targets, classes = data.load_images(path, label_column=column)
            assert loaded.dtype == torch.float32 and torch.equal(loaded, expected), name
            assert torch.equal(targets, torch.from_numpy(labels)) and classes == ["0", "1", "2"], name
    # Without a header or a label column, the label is the last column: here a feature's value.
    one_line_error(lambda: data.load_images(tmp_path / "bare.csv"), "bare.csv:1:6", "expected an integer label")
    one_line_error(lambda: data.load_images(tmp_path / "t.csv", label_column="species"), "t.csv", "'species'")
    one_line_error(lambda: data.load_images(tmp_path / "bare.csv", label_column="Target"), "--label-column",
                   "no header line")
    (tmp_path / "odd.csv").write_text("a,label\n1.5,0\nx,1\n")
    one_line_error(lambda: data.load_images(tmp_path / "odd.csv"), "odd.csv:3:1", "expected a number, got 'x'")
    (tmp_path / "short.csv").write_text("a,b,label\n1,2,0\n3,1\n")
    one_line_error(lambda: data.load_images(tmp_path / "short.csv"), "short.csv:3", "expected 3 fields, got 2")
    # Square rows of pixel values are images; one more column, or a value beyond 255, is a table.
    pixels = numpy.random.default_rng(1).integers(0, 256, (6, 64))
    for extra, shape in ((None, (6, 1, 8, 8)), (1, (6, 65)), (256, (6, 64))):
        rows = numpy.concatenate([pixels, numpy.full((6, 1), extra)], axis=1) if extra == 1 else pixels.copy()
        if extra == 256:
            rows[0, 0] = 256
        (tmp_path / "pixels.csv").write_text("".join(",".join(map(str, [i % 2, *row])) + "\n"
                                                     for i, row in enumerate(rows)))
        loaded = data.load_images(tmp_path / "pixels.csv", label_column=0)[0]
        assert loaded.shape == shape
        assert loaded.dtype == (torch.uint8 if len(shape) == 4 else torch.float32)
        assert torch.equal(loaded.reshape(6, -1).double(), torch.from_numpy(rows).double())


@pytest.mark.skipif(not BINARY, reason="AFTERBURNER_BINARY is set by ctest")
def test_train_learns_a_table_standardised_per_feature(tmp_path):
    train_features, train_labels = blobs(600, 2)
    write_table(tmp_path / "train.csv", train_features, train_labels)
    write_table(tmp_path / "test.csv", *blobs(200, 3))
    length = ("--epochs", "3", "--batch-size", "32", "--lr", "0.02")
    report = train_report(tmp_path / "train.csv", tmp_path, "--val-data", str(tmp_path / "test.csv"), "--model", "mlp",
                          "--export", str(tmp_path / "table.pt"), length=length)
    metadata = {"afterburner.json": ""}
    torch.jit.load(str(tmp_path / "table.pt"), _extra_files=metadata)
    normalise = json.loads(metadata["afterburner.json"])["input"]
    assert (normalise["shape"], normalise["scale"], normalise["mean"]) == ([5], 1, report["data"]["mean"])
    assert report["test_accuracy"] > 0.9
    described = report["data"]
    assert (described["train_samples"], described["evaluation_samples"], described["sample"]) == (600, 200, [5])
    assert numpy.allclose(described["mean"], train_features.mean(0), rtol=1e-12, atol=1e-12)
    spread = train_features.std(0, ddof=1)
    spread[spread == 0] = 1  # a constant feature keeps its scale, as StandardScaler's
    assert numpy.allclose(described["std"], spread, rtol=1e-12)
    # The same folder holding both files is one dataset with both splits.
    same = train_report(tmp_path, tmp_path, "--model", "mlp", length=length)
    assert same["test_accuracy"] == report["test_accuracy"]
    for argv, fragments in ((["--model", "cnn"], ["--model", "rows of 5 features", "mlp"]),
                            (["--model", "mlp", "--image-size", "8"], ["--image-size", "5 features"]),
                            (["--model", "mlp", "--augment"], ["--augment", "rows of features"]),
                            ([], ["--data", "one CSV file", "--val-data"])):
        val = ["--val-data", str(tmp_path / "test.csv")] if argv else []
        run = subprocess.run([BINARY, "train", "--data", str(tmp_path / "train.csv"), *val, *argv, "--max-steps", "1"],
                             capture_output=True, text=True)
        assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert all(fragment in run.stderr for fragment in fragments), run.stderr


@pytest.mark.skipif(not BINARY, reason="AFTERBURNER_BINARY is set by ctest")
def test_train_names_the_classes_of_text_labels(tmp_path):
    names = numpy.array(["virginica", "setosa", "versicolor"])  # label i of blobs() is names[i]
    for split, rows, seed in (("train", 600, 2), ("test", 200, 3)):
        features, labels = blobs(rows, seed)
        write_table(tmp_path / f"iris_{split}.csv", features, names[labels])
    report = train_report(tmp_path, tmp_path, "--model", "mlp", length=("--epochs", "3", "--batch-size", "32"))
    assert report["data"]["classes"] == sorted(set(names)) and report["test_accuracy"] > 0.9
    loaded, targets, classes = data.load_images(tmp_path / "iris_train.csv")
    features, labels = blobs(600, 2)
    assert classes == sorted(names) and torch.equal(loaded, torch.from_numpy(features.astype(numpy.float32)))
    assert [classes[t] for t in targets.tolist()] == names[labels].tolist()
    test = tmp_path / "iris_test.csv"
    lines = test.read_text().splitlines()
    lines[5] = lines[5].replace("setosa", "rosea").replace("virginica", "rosea").replace("versicolor", "rosea")
    test.write_text("\n".join(lines) + "\n")
    run = run_train("--data", tmp_path, "--model", "mlp", "--max-steps", "1")
    assert run.returncode == 1 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "iris_test.csv:6:4: label 'rosea' is not one of the training set's 3 classes" in run.stderr, run.stderr
    skipped = train_report(tmp_path, tmp_path, "--model", "mlp", "--skip-corrupt",
                           length=("--epochs", "1", "--max-steps", "2"))
    assert skipped["data"]["evaluation_samples"] == 199 and len(skipped["data"]["skipped"]) == 1


def run_train(*argv):
    return subprocess.run([BINARY, "train", *map(str, argv)], capture_output=True, text=True)


@pytest.mark.skipif(not BINARY, reason="AFTERBURNER_BINARY is set by ctest")
def test_skip_corrupt_leaves_out_and_lists_each_bad_input(tmp_path):
    root = tmp_path / "set"
    good = 0
    for split, classes in (("train", "ab"), ("val", "ab")):
        for label in classes:
            for index in range(6):
                path = root / split / label / f"{index}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(smooth_image(12, 12, 3, index + (label == "b") * 10)).save(path)
                good += split == "train"
    Image.fromarray(smooth_image(12, 12, 3, 99)).save(tmp_path / "whole.jpg")
    jpeg = (tmp_path / "whole.jpg").read_bytes()
    bad = {root / "train" / "a" / "cut.jpg": jpeg[:len(jpeg) // 2], root / "train" / "b" / "text.png": b"some text",
           root / "train" / "b" / "old.bmp": b"BM", root / "val" / "a" / "cut.jpg": jpeg[:len(jpeg) // 3]}
    for path, content in bad.items():
        write_bytes(path, content)
    (root / "train" / "empty").mkdir()
    write_bytes(root / "val" / "zebra" / "0.png", (root / "val" / "a" / "0.png").read_bytes())
    expected = sorted([*map(str, bad), str(root / "train" / "empty"), str(root / "val" / "zebra")])

    stopped = run_train("--data", root, "--image-size", "8", "--max-steps", "1")
    assert stopped.returncode == 1 and len(stopped.stderr.strip().splitlines()) == 1, stopped.stderr
    assert any(str(path) in stopped.stderr for path in bad), stopped.stderr
    for decode in ("once", "each-epoch"):
        report_path = tmp_path / f"{decode}.json"
        run = run_train("--data", root, "--image-size", "8", "--decode", decode, "--skip-corrupt", "--epochs", "1",
                        "--batch-size", "4", "--report", report_path)
        assert run.returncode == 0, run.stderr
        assert "--skip-corrupt left out 6 bad input(s)" in run.stderr, run.stderr
        described = json.loads(report_path.read_text())["data"]
        assert sorted(line.split(": ")[0] for line in described["skipped"]) == expected, described["skipped"]
        assert (described["train_samples"], described["evaluation_samples"]) == (good, 12)
        assert described["classes"] == ["a", "b", "empty"]  # an empty class keeps its label, as ImageFolder's

    # A CSV's bad rows, by file and line; arrays' test labels the training set does not have.
    (tmp_path / "rows.csv").write_text("a,b,label\n1,2,0\n3,1\n4,x,1\n5,6,1\n7,8,0\n9,9,-1\n")
    report_path = tmp_path / "rows.json"
    run = run_train("--data", tmp_path / "rows.csv", "--validation-split", "0.5", "--model", "mlp", "--skip-corrupt",
                    "--max-steps", "1", "--batch-size", "1", "--report", report_path)
    assert run.returncode == 0, run.stderr
    skipped = json.loads(report_path.read_text())["data"]["skipped"]
    rows = tmp_path / "rows.csv"
    assert skipped == [f"{rows}:3: expected 3 fields, got 2", f"{rows}:4:2: expected a number, got 'x'",
                       f"{rows}:7:3: negative label -1"]
    arrays = tmp_path / "arrays"
    arrays.mkdir()
    for split, labels in (("train", [0, 1, 2, 1]), ("test", [1, 7, 0])):
        numpy.save(arrays / f"x_{split}.npy", numpy.zeros((len(labels), 8, 8), numpy.uint8))
        numpy.save(arrays / f"y_{split}.npy", numpy.array(labels))
    assert run_train("--data", arrays, "--max-steps", "1", "--model", "mlp").returncode == 1
    report_path = tmp_path / "arrays.json"
    run = run_train("--data", arrays, "--max-steps", "1", "--model", "mlp", "--batch-size", "2", "--skip-corrupt",
                    "--report", report_path)
    assert run.returncode == 0, run.stderr
    described = json.loads(report_path.read_text())["data"]
    assert described["evaluation_samples"] == 2
    assert described["skipped"] == [f"{arrays / 'y_test.npy'}: label 7 at index 1 is outside the model's 3 classes"]


@pytest.mark.skipif(not BINARY, reason="AFTERBURNER_BINARY is set by ctest")
def test_an_exported_model_names_its_classes_and_normalisation(formats, tmp_path):
    """The export's afterburner.json alone is enough to use the model: normalising the test images
    by it, Python's predictions give the run's test accuracy; optimize carries it over."""
    paths, splits = formats
    exported, optimized = tmp_path / "model.pt", tmp_path / "optimized.pt"
    report = train_report(paths["folder"], tmp_path, "--precision", "fp32", "--export", str(exported))
    metadata = {"afterburner.json": ""}
    model = torch.jit.load(str(exported), _extra_files=metadata)
    described = json.loads(metadata["afterburner.json"])
    assert described["classes"] == report["data"]["classes"] == [f"class{i}" for i in range(10)]
    normalise = described["input"]
    assert normalise["shape"] == [1, 28, 28] and normalise["scale"] == 1 / 255
    assert normalise["mean"] == report["data"]["mean"] and normalise["std"] == report["data"]["std"]
    images, labels = splits["test"]
    pixels = torch.from_numpy(images.copy())[:, None].float() * normalise["scale"]
    inputs = (pixels - torch.tensor(normalise["mean"])[:, None, None]) / torch.tensor(normalise["std"])[:, None, None]
    with torch.no_grad():
        predicted = model(inputs).argmax(1)
    accuracy = (predicted == torch.from_numpy(labels.astype(numpy.int64))).float().mean().item()
    assert abs(accuracy - report["test_accuracy"]) <= 1 / TEST + 1e-9
    run = subprocess.run([BINARY, "optimize", str(exported), "-o", str(optimized), "--input-shape", "1,28,28"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    carried = {"afterburner.json": ""}
    torch.jit.load(str(optimized), _extra_files=carried)
    assert carried == metadata
