"""Image folders: reading, decoding and augmenting ``imagefolder:<root>`` samples.

Every training sample's augmentation (crop box and flip) is drawn from its own
``torch.Generator`` seeded by (seed, epoch, index) (:func:`augment_params`). Nothing touches
torch's global RNG, so no per-sample ``fork_rng`` is needed, loader workers and their number
do not matter, and a resumed run sees the same boxes an uninterrupted one would.

Decoding is torchvision.io's (libjpeg-turbo, libpng) straight into a uint8 tensor, and the
crop, resize, flip and normalisation are torchvision's tensor ops on it. Resizing a tensor
and resizing a PIL image agree to within a few pixel levels (both antialias), not bit for bit.
"""

from __future__ import annotations

# Each dataset's library (torchvision, Pillow) is imported only when an image folder is the
# dataset: every worker process of the other datasets starts without them.
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from tula.config import ConfigError, Data

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SCALE, LOG_RATIO = (0.08, 1.0), (math.log(3 / 4), math.log(4 / 3))  # RandomResizedCrop's defaults


@dataclass(frozen=True)
class Augment:
    """One sample's augmentation, in the stored image's pixels: crop the box (top, left,
    height, width), resize it to the output size, then flip if ``flip``. For ``crop_flip``
    the box is the padded random crop of the resized, center-cropped image."""

    top: int
    left: int
    height: int
    width: int
    flip: bool


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of one sample's random draws in one epoch."""
    return ((seed * 1_000_003 + epoch) * 2_147_483_647 + index) % 2**63


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """The generator of one sample's random draws: the same (seed, epoch, index), the same draws."""
    return torch.Generator().manual_seed(sample_seed(seed, epoch, index))


def _uniform(g: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand((), generator=g))


def _randint(g: torch.Generator, hi: int) -> int:
    """An integer in [0, hi]."""
    return int(torch.randint(0, hi + 1, (), generator=g))


def resized_crop_box(g: torch.Generator, height: int, width: int) -> tuple[int, int, int, int]:
    """RandomResizedCrop's box (scale 0.08-1, aspect 3/4-4/3), drawn from ``g``: ten tries,
    then the central crop, as torchvision's ``RandomResizedCrop.get_params``."""
    area = height * width
    for _ in range(10):
        target = area * _uniform(g, *SCALE)
        aspect = math.exp(_uniform(g, *LOG_RATIO))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return _randint(g, height - h), _randint(g, width - w), h, w
    ratio = width / height
    w, h = width, height
    if ratio < 3 / 4:
        h = round(w / (3 / 4))
    elif ratio > 4 / 3:
        w = round(h * 4 / 3)
    return (height - h) // 2, (width - w) // 2, h, w


def augment_params(d: Data, seed: int, epoch: int, index: int, height: int, width: int) -> Augment:
    """Sample ``index``'s augmentation in ``epoch`` for a stored image of height x width."""
    g = sample_generator(seed, epoch, index)
    if d.train_augment == "random_resized_crop":
        box = resized_crop_box(g, height, width)
    else:  # crop_flip: an offset into the padded image_size square
        pad = max(d.image_size // 8, 1)
        box = (_randint(g, 2 * pad), _randint(g, 2 * pad), d.image_size, d.image_size)
    return Augment(*box, flip=float(torch.rand((), generator=g)) < 0.5)


# -- the CPU path: decode and transform one sample ---------------------------------------


IO_FORMATS = (".jpg", ".jpeg", ".png", ".webp", ".gif")  # what torchvision.io decodes


def decode(path: str | Path) -> torch.Tensor:
    """An image file as a 3 x H x W uint8 RGB tensor: torchvision.io's decoder for JPEG, PNG,
    WebP and GIF, Pillow for the other formats ImageFolder lists (BMP, TIFF, PPM, PGM)."""
    if str(path).lower().endswith(IO_FORMATS):
        from torchvision.io import ImageReadMode, decode_image, read_file

        return decode_image(read_file(str(path)), mode=ImageReadMode.RGB)
    from PIL import Image
    from torchvision.transforms.v2.functional import pil_to_tensor

    with Image.open(path) as img:
        return pil_to_tensor(img.convert("RGB"))


def normalise(x: torch.Tensor, d: Data) -> torch.Tensor:
    """uint8 image(s) -> float in [0, 1], ImageNet-normalised where ``data.normalize`` says."""
    x = x.float().div_(255)
    if d.normalize == "imagenet":
        shape = (3, 1, 1) if x.ndim == 3 else (1, 3, 1, 1)
        mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(shape)
        std = torch.tensor(IMAGENET_STD, device=x.device).view(shape)
        x = x.sub_(mean).div_(std)
    return x


def test_view(img: torch.Tensor, d: Data) -> torch.Tensor:
    """The evaluation view: shorter side resized to ``data.resize``, then the center square."""
    from torchvision.transforms.v2 import functional as F

    size = d.image_size
    img = F.resize(img, [d.resize or round(size * 8 / 7)], antialias=True)
    return F.center_crop(img, [size, size])


def train_view(img: torch.Tensor, d: Data, a: Augment) -> torch.Tensor:
    """The training view of ``img`` under augmentation ``a``."""
    from torchvision.transforms.v2 import functional as F

    size = d.image_size
    if d.train_augment == "random_resized_crop":
        img = F.resized_crop(img, a.top, a.left, a.height, a.width, [size, size], antialias=True)
    else:
        pad = max(size // 8, 1)
        img = F.center_crop(F.resize(img, [size], antialias=True), [size, size])
        img = F.crop(F.pad(img, [pad]), a.top, a.left, size, size)
    return F.horizontal_flip(img) if a.flip else img


class Encoded:
    """A batch of JPEG files not yet decoded: each file's bytes (Python ``bytes``: a loader
    worker hands them over by pickling, where a tensor each would cost a shared-memory file
    descriptor) and each sample's augmentation as rows (top, left, height, width, flip) of
    ``boxes``; ``train``: training views (else evaluation views). pin_memory leaves it as is."""

    def __init__(self, data: list[bytes], boxes: torch.Tensor, train: bool):
        self.data, self.boxes, self.train = data, boxes, train

    def __len__(self) -> int:
        return len(self.data)


def decode_batch(enc: Encoded, d: Data, device: torch.device) -> torch.Tensor:
    """An encoded batch decoded on ``device`` (nvJPEG on CUDA, in one call for the batch) and
    cropped, resized, flipped and normalised there: the same views as the CPU path, from the
    same boxes. CUDA's decoder and libjpeg-turbo may differ by a few pixel levels."""
    from torchvision.io import ImageReadMode, decode_jpeg

    raw = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in enc.data]
    imgs = decode_jpeg(raw, mode=ImageReadMode.RGB, device=device)
    boxes = enc.boxes.tolist()  # a CPU tensor: no wait for the device
    views = [
        train_view(img, d, Augment(*box[:4], flip=bool(box[4]))) if enc.train else test_view(img, d)
        for img, box in zip(imgs, boxes)
    ]
    return normalise(torch.stack(views), d)


JPEG = (".jpg", ".jpeg")


def decode_on_device(d: Data, device_type: str, ds) -> bool:
    """``data.decode``: are this training set's files decoded on the device? ``gpu``: yes (JPEG
    files only: nvJPEG); ``cpu``: no; ``auto``: on CUDA where every file is a JPEG. Other
    datasets have no files to decode."""
    if d.decode == "cpu":
        return False
    if not isinstance(ds, ImageFiles):
        if d.decode == "gpu":
            raise ConfigError(
                "config key 'data.decode': gpu decodes the JPEG files of imagefolder: datasets; "
                "this dataset has none: set data.decode: auto or cpu"
            )
        return False
    other = next((p for p, _ in ds.samples if not p.lower().endswith(JPEG)), None)
    if d.decode == "gpu" and other is not None:
        raise ConfigError(
            f"config key 'data.decode': gpu decodes JPEG files only (nvJPEG), and {other} is not "
            "one: set data.decode: auto (JPEG folders on the GPU, others on the CPU) or cpu"
        )
    return d.decode == "gpu" or (device_type == "cuda" and other is None)


class ImageFiles(torch.utils.data.Dataset):
    """One split of an image folder (torchvision's ``ImageFolder`` finds the files and classes).

    ``ds[i]`` is the evaluation view; ``ds.seeded(seed, epoch, i)`` the training view of sample
    i in that epoch, its augmentation drawn by :func:`augment_params`."""

    def __init__(self, root: Path, d: Data, train: bool):
        from torchvision.datasets import ImageFolder

        found = ImageFolder(str(root))
        self.samples, self.targets, self.classes = found.samples, found.targets, found.classes
        self.d, self.train = d, train and d.train_augment != "none"

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[i]
        return normalise(test_view(decode(path), self.d), self.d), label

    def seeded(self, seed: int, epoch: int, i: int) -> tuple[torch.Tensor, int]:
        if not self.train:
            return self[i]
        path, label = self.samples[i]
        img = decode(path)
        a = augment_params(self.d, seed, epoch, i, img.shape[-2], img.shape[-1])
        return normalise(train_view(img, self.d, a), self.d), label

    def encoded(self, seed: int, epoch: int, keys: list[int]) -> tuple[Encoded, torch.Tensor]:
        """Samples ``keys`` of ``epoch`` as file bytes and boxes (:func:`decode_batch` decodes
        them): the box comes from the image's size in its header, drawn as :meth:`seeded` draws
        it."""
        from PIL import Image

        data, boxes = [], []
        for i in keys:
            path = self.samples[i][0]
            with Image.open(path) as im:  # the header only
                width, height = im.size
            a = (
                augment_params(self.d, seed, epoch, i, height, width)
                if self.train
                else Augment(0, 0, 0, 0, False)
            )
            data.append(Path(path).read_bytes())
            boxes.append((a.top, a.left, a.height, a.width, int(a.flip)))
        labels = torch.tensor([self.targets[i] for i in keys], dtype=torch.long)
        return Encoded(data, torch.tensor(boxes, dtype=torch.long), self.train), labels


def image_folder(root: str, d: Data, key: str) -> tuple[ImageFiles, ImageFiles]:
    """(train, test) of ``root/train/<class>/*`` and ``root/val/<class>/*``; a mistake raises a
    ConfigError naming ``key``."""
    top = Path(root)
    for split in ("train", "val"):
        sub = top / split
        if not sub.is_dir():
            raise ConfigError(
                f"{key}: image folder {sub} not found; imagefolder:<root> needs "
                "root/train/<class>/* and root/val/<class>/*"
            )
        classes = [c for c in sorted(sub.iterdir()) if c.is_dir()]
        if not classes:
            raise ConfigError(
                f"{key}: {sub} has no class folders; put each class's images in {sub}/<class>/"
            )
    try:
        import torchvision.io  # noqa: F401 - the decoder
    except Exception as exc:  # noqa: BLE001 - ImportError or a binary mismatch with torch
        raise ConfigError(
            f"{key}: imagefolder datasets need torchvision, which does not import here ({exc})"
        ) from None
    try:
        train, test = (
            ImageFiles(top / "train", d, train=True),
            ImageFiles(top / "val", d, train=False),
        )
    except (FileNotFoundError, RuntimeError) as exc:  # a class folder without any image file
        raise ConfigError(f"{key}: {top}: {exc}") from None
    if train.classes != test.classes:
        only_train = sorted(set(train.classes) - set(test.classes))
        only_val = sorted(set(test.classes) - set(train.classes))
        raise ConfigError(
            f"{key}: {top}/train and {top}/val have different class folders (only in train: "
            f"{only_train or 'none'}; only in val: {only_val or 'none'})"
        )
    return train, test
