"""How fast an image folder reaches the model: the input pipeline alone, side by side in one run.

Variants, each through a DataLoader with the same batch sampler and loader workers:

  before   torchvision's ImageFolder with the PIL transforms (RandomResizedCrop, flip,
           ToTensor, Normalize), each sample inside torch.random.fork_rng seeded by
           (seed, epoch, index): Tula's CPU path until this benchmark's change
  tula     Tula's imagefolder dataset as the probe and production read it
           (tula.runtime.input.images: torchvision.io decoding into uint8 tensors, a per-sample
           torch.Generator for the crop box and flip, tensor crop/resize/normalise)
  tula_decode_on_device   (JPEG only) data.decode: gpu through Tula's feed on --device:
           loader workers read bytes and boxes, the batch is decoded and transformed on the
           device (nvJPEG on CUDA; on CPU the same code in the training process)

Then the parts alone, per image: decoding (PIL's open + convert + to tensor against
torchvision.io's decode_image) and per-sample seeding (fork_rng + manual_seed against a
Generator of its own).

    .venv/bin/python bench/gpu_input.py --device cpu --format png --images 600 --workers 0,1,2
    python bench/gpu_input.py --device cuda --format jpg --images 3000 --size 224 --workers 8,16

Prints one row per (variant, loader workers) and writes --out (JSON). Images/s is the median
of --repeats passes over --batches batches each (the first batch of a pass, the workers'
start, is left out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tula import config as config_mod
from tula.runtime.input import data as data_mod
from tula.runtime.input import loader as loader_mod
from tula.runtime.input.feed import DeviceFeed
from tula.runtime.input.images import IMAGENET_MEAN, IMAGENET_STD, decode, sample_seed


def _one_image(args) -> None:
    root, i, split, fmt = args
    rng = np.random.default_rng(i)
    k = i % 10
    h, w = 300 + (i % 7) * 10, 360 - (i % 5) * 12  # about the size of ../shared/gpu/mkjpeg.py's
    base = np.array([(k * 37) % 256, (k * 91) % 256, (k * 53) % 256], np.float32)
    img = (
        base
        + rng.normal(0, 40, (h, w, 3))
        + np.linspace(-40, 40, w)[None, :, None] * (1 if k % 2 else -1)
    )
    out = Path(root) / split / f"class_{k}"
    out.mkdir(parents=True, exist_ok=True)
    from PIL import Image

    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(
        out / f"{i:06d}.{fmt}", **({"quality": 90} if fmt == "jpg" else {})
    )


def make_folder(root: Path, images: int, fmt: str) -> Path:
    val = max(images // 10, 10)
    jobs = [(str(root), i, "train", fmt) for i in range(images)] + [
        (str(root), images + i, "val", fmt) for i in range(val)
    ]
    with Pool(os.cpu_count()) as p:
        p.map(_one_image, jobs, chunksize=32)
    return root


class Before(torch.utils.data.Dataset):
    """The former path: ImageFolder + PIL transforms, fork_rng per sample."""

    def __init__(self, root: Path, size: int, seed: int):
        from torchvision import transforms as T
        from torchvision.datasets import ImageFolder

        tf = T.Compose(
            [
                T.RandomResizedCrop(size),
                T.RandomHorizontalFlip(),
                T.ToTensor(),
                T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
            ]
        )
        self.base, self.seed = ImageFolder(str(root / "train"), transform=tf), seed

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key):
        epoch, i = key
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(sample_seed(self.seed, epoch, i))
            return self.base[i]


def images_per_s(
    dataset, sampler, workers: int, batches: int, repeats: int
) -> tuple[float, list[float]]:
    dl = DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=workers,
        collate_fn=data_mod.collate,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers else None,
    )
    rates = []
    for epoch in range(1, repeats + 1):
        sampler.set_position(epoch, 0)
        it = iter(dl)
        next(it)  # the workers' start
        t0, seen = time.perf_counter(), 0
        for _, (x, _) in zip(range(batches), it):
            seen += x.shape[0]
        rates.append(seen / (time.perf_counter() - t0))
    return statistics.median(rates), rates


def feed_images_per_s(
    raw: dict, ds, device: torch.device, workers: int, batch: int, batches: int, repeats: int
) -> tuple[float, list[float]]:
    """Images/s through Tula's DeviceFeed (decoding on the device), synchronised per batch."""
    cfg = config_mod.from_dict(
        {**raw, "data": {**raw["data"], "decode": "gpu", "num_workers": workers}}
    )
    loaders = loader_mod.Loaders(cfg, ds, 0, 1, device)
    dl, sampler = loaders.train(batch)
    feed = DeviceFeed.of(loaders, dl, sampler, channels_last=True)
    rates = []
    for epoch in range(1, repeats + 1):
        sampler.set_position(epoch, 0)
        it = iter(feed)
        next(it)
        t0, seen = time.perf_counter(), 0
        for _, (x, _) in zip(range(batches), it):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seen += x.shape[0]
        rates.append(seen / (time.perf_counter() - t0))
    return statistics.median(rates), rates


def per_image_us(fn, items, repeats: int = 3) -> float:
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for it in items:
            fn(it)
        best.append((time.perf_counter() - t0) / len(items) * 1e6)
    return statistics.median(best)


def parts(root: Path, n: int = 100) -> dict:
    from PIL import Image
    from torchvision.transforms.functional import pil_to_tensor

    files = sorted((root / "train").rglob("*.*"))[:n]

    def pil(p):
        with Image.open(p) as img:
            return pil_to_tensor(img.convert("RGB"))

    def fork(i):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(sample_seed(0, 1, i))
            return torch.rand(())

    def own(i):
        return torch.rand((), generator=torch.Generator().manual_seed(sample_seed(0, 1, i)))

    keys = list(range(1000))
    return {
        "decode_pil_us": per_image_us(pil, files),
        "decode_torchvision_io_us": per_image_us(decode, files),
        "seed_fork_rng_us": per_image_us(fork, keys),
        "seed_generator_us": per_image_us(own, keys),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument(
        "--folder", type=Path, help="an image folder (root/train/<class>/*); default: one made here"
    )
    ap.add_argument("--format", default="png", choices=["png", "jpg"])
    ap.add_argument("--images", type=int, default=600)
    ap.add_argument("--size", type=int, default=64, help="data.image_size")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", default="0,1,2")
    ap.add_argument("--out", type=Path, default=Path("gpu_input.json"))
    a = ap.parse_args()
    torch.set_num_threads(1)  # as in a loader worker; the main process is one of them at 0 workers
    scratch = Path(tempfile.mkdtemp(prefix="tula-gpu-input-"))
    root = a.folder or make_folder(scratch / "images", a.images, a.format)
    raw = {
        "workload": {"dataset": f"imagefolder:{root}"},
        "data": {"image_size": a.size, "train_augment": "random_resized_crop"},
    }
    cfg = config_mod.from_dict(raw)
    tula_ds = loader_mod.Seeded(data_mod.load_config(cfg).train, cfg.workload.seed)
    before_ds = Before(root, a.size, cfg.workload.seed)
    n = len(tula_ds)
    rows = []
    for workers in [int(w) for w in a.workers.split(",")]:
        for name, ds in (("before", before_ds), ("tula", tula_ds)):
            sampler = loader_mod.EpochBatchSampler(n, a.batch, 0, 1, cfg.workload.seed)
            rate, rates = images_per_s(
                ds, sampler, workers, min(a.batches, len(sampler) - 1), a.repeats
            )
            rows.append(
                {"variant": name, "workers": workers, "images_per_s": rate, "passes": rates}
            )
            print(
                f"{name:7s} workers={workers:2d}  {rate:8.1f} images/s  passes "
                f"{[round(r) for r in rates]}",
                flush=True,
            )
        if a.format == "jpg":
            rate, rates = feed_images_per_s(
                raw,
                data_mod.load_config(cfg),
                torch.device(a.device),
                workers,
                a.batch,
                min(a.batches, n // a.batch - 1),
                a.repeats,
            )
            rows.append(
                {
                    "variant": "tula_decode_on_device",
                    "workers": workers,
                    "images_per_s": rate,
                    "passes": rates,
                }
            )
            print(
                f"tula_decode_on_device workers={workers:2d}  {rate:8.1f} images/s  passes "
                f"{[round(r) for r in rates]}",
                flush=True,
            )
    by = {(r["variant"], r["workers"]): r["images_per_s"] for r in rows}
    for workers in sorted({r["workers"] for r in rows}):
        print(
            f"workers={workers:2d}  tula / before = "
            f"{by['tula', workers] / by['before', workers]:.2f}x"
        )
    p = parts(root)
    print("per image: " + ", ".join(f"{k} {v:.0f}" for k, v in p.items()))
    result = {
        "device": torch.cuda.get_device_name()
        if a.device == "cuda"
        else f"cpu ({os.cpu_count()} cores)",
        "torch": torch.__version__,
        "format": a.format,
        "images": n,
        "image_size": a.size,
        "batch": a.batch,
        "rows": rows,
        "parts": p,
        "command": " ".join(sys.argv),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
