"""afterburner's threaded loaders: for tensors or numpy arrays held in memory (Loader), and for
folders of JPEG/PNG images decoded and augmented each epoch (ImageFolder); the dataset readers.

    from afterburner import data
    images, labels = data.load_mnist("/usr/share/datasets/fashion-mnist", "train")  # uint8, int64
    loader = data.Loader(images, labels, batch_size=128, shuffle=True, workers=2,
                         scale=1 / 255, mean=[0.2860], std=[0.3530], random_crop=2)
    for epoch in range(3):
        for x, y in loader:          # float32 [128, 1, 28, 28], int64 [128]; a new order each epoch
            ...

Worker threads in C++ gather each batch with one vectorized index_select and run the image
transforms as one fused pass over the batch (uint8 -> scale -> normalize -> random crop ->
horizontal flip), while Python trains on the batch before: no worker processes, no per-sample
Python, no copy of a batch on its way out. The order of an epoch is a function of (seed, epoch)
alone and each batch's random transforms of (seed, epoch, batch), so every worker count yields
the same batches. Iterating again starts the next epoch (set_epoch chooses one).
"""
from typing import Optional, Sequence

import numpy
import torch

__all__ = ["Loader", "ImageFolder", "load_mnist", "load_images", "decode_image", "read_idx", "read_npy", "read_csv",
           "pack", "read_pack"]


def _tensor(array, name):
    if isinstance(array, numpy.ndarray):
        return torch.from_numpy(array)  # shares the array's memory
    if isinstance(array, torch.Tensor):
        return array
    raise TypeError(f"{name}: expected a torch.Tensor or numpy.ndarray, got {type(array).__name__}")


class Loader:
    """Batches of (inputs, targets) from two tensors or arrays with the same first dimension.

    inputs: [N, ...] of any dtype (the image transforms take uint8 or float [N, C, H, W]);
    targets: [N] of an integer type, yielded as int64. Without scale, mean, random_crop and
    horizontal_flip the inputs come out as stored; with any of them, as float32.
    """

    def __init__(self, inputs, targets, batch_size: int = 128, shuffle: bool = True, drop_last: bool = True,
                 workers: int = 2, prefetch: int = 4, seed: int = 0, channels_last: bool = False,
                 scale: Optional[float] = None, mean: Optional[Sequence[float]] = None,
                 std: Optional[Sequence[float]] = None, random_crop: int = 0, horizontal_flip: float = 0.0):
        if (mean is None) != (std is None):
            raise ValueError("Loader: give mean and std together")
        transform = scale is not None or mean is not None or random_crop > 0 or horizontal_flip > 0
        self._loader = torch.classes.afterburner.Loader(
            _tensor(inputs, "inputs"), _tensor(targets, "targets"), batch_size, shuffle, drop_last, workers, prefetch,
            seed, channels_last, transform, 1.0 if scale is None else float(scale), [float(m) for m in mean or []],
            [float(s) for s in std or []], random_crop, float(horizontal_flip))
        self.epoch = 0

    def __len__(self) -> int:
        return self._loader.batches_per_epoch()

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (later iterations count on from it)."""
        self.epoch = epoch

    def __iter__(self):
        self._loader.start_epoch(self.epoch)
        self.epoch += 1
        while True:
            batch = self._loader.next()
            if not batch:
                return
            yield batch[0], batch[1]


class ImageFolder(Loader):
    """Batches of (images [N, 3, size, size], labels int64 [N]) from a folder of class folders of
    JPEG/PNG files (torchvision's ImageFolder layout, classes in `classes`), or a pack of them
    (`pack`, a root ending in .abpk), decoded and augmented each epoch by C++ worker threads, the
    GIL released:

        train = ImageFolder("pets/train", size=224, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        val = ImageFolder("pets/val", train=False, classes=train.classes, mean=..., std=...)
        train = ImageFolder("pets/train", transforms="resize256,crop224,flip", mean=..., std=...)

    `transforms` lists the augmentation as `afterburner train --transforms` does: rrcS[:MIN]
    (RandomResizedCrop), resizeR (the shorter side), cropS (RandomCrop), centreS (CenterCrop),
    flip[:P] (RandomHorizontalFlip); by default "rrc,flip" (RandomResizedCrop(size) +
    RandomHorizontalFlip(flip)); then ToTensor + Normalize(mean, std). train=False takes the same
    list's evaluation counterpart, Resize(size * 256 // 224) (or the list's resize) + CenterCrop(size),
    unflipped (as the centre box resampled once). `size` is the list's crop, else 224. JPEGs decode
    at a reduced DCT scale where the crop allows (reduced_decode=False decodes them whole). Batches
    are float32 or bfloat16 (`dtype`: each value rounded as Tensor.to rounds it), and laid out
    channels_last when asked, written so by the decoder. Shuffled, and the last partial batch
    dropped, in training only unless said otherwise. The batches depend on (seed, epoch) alone. A
    pack larger than half the available memory is shuffled in FFCV's quasi-random order
    (order="auto"; "block-local" always, "exact" never: its 4 MiB blocks in random order, 16 at a
    time, samples shuffled within); the attribute `order` says which."""

    def __init__(self, root: str, size: Optional[int] = None, train: bool = True, batch_size: int = 64,
                 classes: Optional[Sequence[str]] = None, mean: Optional[Sequence[float]] = None,
                 std: Optional[Sequence[float]] = None, flip: float = 0.5, workers: int = 2, prefetch: int = 4,
                 seed: int = 0, shuffle: Optional[bool] = None, drop_last: Optional[bool] = None,
                 channels_last: bool = False, reduced_decode: bool = True, order: str = "auto",
                 transforms: Optional[str] = None, dtype: torch.dtype = torch.float32):
        if (mean is None) != (std is None):
            raise ValueError("ImageFolder: give mean and std together")
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"ImageFolder: dtype must be torch.float32 or torch.bfloat16, got {dtype}")
        if transforms is None:
            transforms = f"rrc,flip:{float(flip)}" if flip > 0 else "rrc"
        known = None if classes is None else list(classes)
        settings = (transforms, size or 0, train, batch_size, train if shuffle is None else shuffle,
                    train if drop_last is None else drop_last, workers, prefetch, seed, channels_last,
                    [float(m) for m in mean or []], [float(s) for s in std or []], reduced_decode, dtype)
        if order not in ("auto", "exact", "block-local"):
            raise ValueError(f"ImageFolder: order must be auto, exact or block-local, got {order!r}")
        if str(root).endswith(".abpk"):
            _, labels, self.classes, larger_than_memory = torch.ops.afterburner.read_pack_index(str(root))
            if known is not None and known != self.classes:
                raise ValueError(f"ImageFolder: {root} packs the classes {self.classes}, not {known}")
            self.targets = labels
            self.samples = [f"{root} record {i}" for i in range(len(labels))]
            block_local = order == "block-local" or (order == "auto" and larger_than_memory)
            self.order = "block-local" if block_local else "exact"
            self._loader = torch.ops.afterburner.pack_loader(str(root), *settings, block_local)
        else:
            if order == "block-local":
                raise ValueError(f"ImageFolder: block-local orders a pack's blocks; {root} is a folder")
            self.order = "exact"
            self.samples, self.targets, self.classes = torch.ops.afterburner.list_image_folder(str(root), known)
            self._loader = torch.ops.afterburner.image_folder_loader(self.samples, self.targets, self.classes,
                                                                    *settings)
        self.epoch = 0


def resample_box(image: torch.Tensor, x: int, y: int, width: int, height: int, size: int) -> torch.Tensor:
    """The box of a uint8 [C, H, W] image resampled to size x size as ImageFolder does it (float, 0-255)."""
    return torch.ops.afterburner.resample_box(image, x, y, width, height, size)


def read_idx(path: str) -> torch.Tensor:
    """An IDX file (raw or .gz) as a tensor of its own element type and shape."""
    return torch.ops.afterburner.read_idx(str(path))


def load_mnist(directory: str, split: str = "train"):
    """(images uint8 [N, 1, 28, 28], labels int64 [N]) of an MNIST-layout directory; split
    'train' or 'test' (the t10k files)."""
    return torch.ops.afterburner.load_mnist(str(directory), split)


def load_images(path: str, format: str = "auto", split: str = "train", image_size: int = 0, classes=None,
                label_column=None):
    """(images uint8 [N, C, S, S], labels int64 [N], class names) of any dataset `afterburner train
    --data` reads: a folder of MNIST-layout IDX files, of class folders of JPEG/PNG images
    (torchvision's ImageFolder layout; with train/ and val/ inside, those are the splits), of
    CIFAR-10/100 binary batches, of x_train.npy and its kin, or of a *train.csv and a *test.csv;
    an .npz archive; a CSV file. `format` is 'auto' (told by what `path` holds), 'idx', 'folder',
    'cifar', 'npy' or 'csv'; `split` 'train' or 'test'. Image folders' images are resized (shorter
    side, antialiased) and centre-cropped to `image_size` when it is not 0, and labelled by
    `classes` (a training folder's) when given. A CSV file's label is in `label_column` (a header
    name or an index; by default the column named label, target, class or y, else the last); its
    rows are grayscale images when they hold a square count of integers in [0, 255], else
    features (float32 [N, F])."""
    column = "" if label_column is None else str(label_column)
    return torch.ops.afterburner.load_images(str(path), format, split, image_size,
                                            None if classes is None else list(classes), column)


def decode_image(path: str) -> torch.Tensor:
    """A JPEG or PNG file as uint8 [C, H, W]: one channel for grayscale, else RGB (alpha dropped)."""
    return torch.ops.afterburner.decode_image_file(str(path))


def read_npy(path: str) -> torch.Tensor:
    """A NumPy .npy file as a tensor of its dtype and shape."""
    return torch.ops.afterburner.read_npy(str(path))


def read_csv(path: str, label_column: int = -1, label_name: Optional[str] = None, header: bool = True,
             delimiter: str = ",", classes: int = 0):
    """(features float32 [N, F], labels int64 [N]) of a numeric CSV file: every cell a number
    (spaces and double quotes around it ignored), blank lines skipped, the label a non-negative
    integer in column `label_column` (negative counts from the end) or in the column the header
    names `label_name`, and below `classes` when that is given. Errors name file:line:column."""
    return torch.ops.afterburner.read_csv(str(path), label_column, label_name or "", header, delimiter, classes)


def pack(source: str, output: str, max_side: int = 0, quality: int = 90, raw: bool = False, classes=None,
         skip_corrupt: bool = False) -> dict:
    """Packs the image folder `source` into the .abpk file `output`, which ImageFolder and `afterburner
    train --data` memory-map: each image as stored (max_side=0), or with its longer side brought
    down to max_side and re-encoded as JPEG at `quality`, or decoded (raw=True). `classes` labels
    the class folders (a validation folder packed with its training pack's classes). Resumable: an
    interrupted call, run again with the same arguments, continues after its last whole record.
    Returns {"records", "resumed", "bytes", "skipped"}."""
    records, resumed, size, skipped = torch.ops.afterburner.pack_image_folder(
        str(source), str(output), max_side, quality, raw, None if classes is None else list(classes), skip_corrupt)
    return {"records": records, "resumed": resumed, "bytes": size, "skipped": skipped}


def read_pack(path: str):
    """(images: a list of uint8 [C, H, W], labels int64 [N], class names) of a pack, every record
    decoded whole."""
    return torch.ops.afterburner.read_pack(str(path))
