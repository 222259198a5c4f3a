"""The datasets every probe, training run and compare run reads (the input pipeline over them,
order and position, is :mod:`tula.runtime.input.loader`).

Sources (config key ``workload.dataset``):

- ``digits``: scikit-learn's 8x8 handwritten digits (ships inside scikit-learn), 1 x 8 x 8.
- ``mnist1d``: the MNIST-1D benchmark generated locally by the `mnist1d` package, 1 x 40.
  These two are made once and then read from a cache (:mod:`tula.runtime.input.builtin_sets`).
- ``npz:<path>``: arrays ``x_train, y_train, x_test, y_test``; x is (n, L), (n, H, W),
  (n, C, L) or (n, C, H, W) (channels first), or (n, H, W, C) with C <= 4 < H (numpy's and
  TensorFlow's image layout, read as channels first); y holds class ids 0..K-1.
  These three are held in memory and standardised with the training set's mean and std.
- ``imagefolder:<root>``: ``root/train/<class>/*`` and ``root/val/<class>/*``, decoded and
  augmented by :mod:`tula.runtime.input.images` with the ``data`` section's settings (train: random
  resized crop or crop + flip; test: resize + center crop; ImageNet normalisation).
- ``package.module:callable``: your own; called with no arguments, it returns
  ``(train_dataset, test_dataset)``, map-style torch Datasets yielding ``(tensor, int)``.
  Give them a ``classes`` list (or ``targets``) so the class count is known without a scan.
"""

from __future__ import annotations

# Each dataset's library (scikit-learn, mnist1d, torchvision) is imported only when that
# dataset is the one configured: every worker process starts faster, and a torchvision that
# does not import beside this torch is an error naming workload.dataset, not a crash at import.
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import default_collate

from tula.config import Config, ConfigError, Data, Workload
from tula.dataset_paths import NPZ_KEYS, check_npz_file
from tula.runtime.input import builtin_sets

KEY = "config key 'workload.dataset'"


# -- in-memory sets ---------------------------------------------------------------------


class TensorSet(TorchDataset):
    """Samples held in memory. ``__getitems__`` hands the DataLoader a whole batch with one
    indexing operation (the fast path for small sets); it is the same loader and step.

    ``x`` is kept in its stored dtype: an integer set (uint8 images) is not converted on the
    host; ``norm`` = (mean, std) is then applied to each batch where it is, on the device in
    training (:meth:`WorkloadData.as_input`), as DALI and FFCV do: a quarter of float32's
    bytes held, copied to the device and kept there. A float set is standardised once, here
    (``norm`` None)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, norm: tuple[float, float] | None = None):
        self.x, self.y, self.norm = x, y, norm

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.x[i], int(self.y[i])

    def __getitems__(self, idx: list[int]) -> "Batched":
        t = torch.as_tensor(idx, dtype=torch.long)
        return Batched((self.x[t], self.y[t]))

    @property
    def targets(self) -> torch.Tensor:
        return self.y


class Batched(tuple):
    """A batch a dataset assembled itself; :func:`collate` passes it through."""


def collate(data: Any) -> Any:
    return tuple(data) if isinstance(data, Batched) else default_collate(data)


def _npz(path: str):
    p = Path(path)
    check_npz_file(p)
    with np.load(p) as z:
        arrays = {k: z[k] for k in NPZ_KEYS}
    # integer samples (uint8 images) stay as stored; others become float32
    x_tr, x_te = (
        arrays[k] if np.issubdtype(arrays[k].dtype, np.integer) else arrays[k].astype(np.float32)
        for k in ("x_train", "x_test")
    )
    y_tr, y_te = (arrays[k] for k in ("y_train", "y_test"))
    for key, x, y in (("train", x_tr, y_tr), ("test", x_te, y_te)):
        if x.ndim not in (2, 3, 4):
            raise ConfigError(
                f"{p}: x_{key} must be (n, L), (n, H, W), (n, C, L) or (n, C, H, W); got {x.shape}"
            )
        if y.ndim != 1 or len(y) != len(x):
            raise ConfigError(
                f"{p}: y_{key} must be 1-D with one label per row of x_{key}; got {y.shape}"
            )
        if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
            raise ConfigError(f"{p}: y_{key} must hold non-negative integer class ids")
    if x_tr.shape[1:] != x_te.shape[1:]:
        raise ConfigError(
            f"{p}: x_train samples {x_tr.shape[1:]} and x_test samples {x_te.shape[1:]} differ"
        )
    if x_tr.ndim == 2 or x_tr.ndim == 3 and x_tr.shape[1] > 4:
        # (n, L) -> (n, 1, L);  (n, H, W) with H > 4 is an image without a channel axis.
        x_tr, x_te = x_tr[:, None], x_te[:, None]
    if x_tr.ndim == 4 and x_tr.shape[3] <= 4 < x_tr.shape[1]:
        # (n, H, W, C), images as numpy and TensorFlow store them: the model takes (C, H, W),
        # so they are laid out channels first once, as they load (a copy of the set).
        x_tr, x_te = (np.ascontiguousarray(x.transpose(0, 3, 1, 2)) for x in (x_tr, x_te))
    return x_tr, x_te, y_tr.astype(np.int64), y_te.astype(np.int64)


def _in_memory(x_tr, x_te, y_tr, y_te) -> tuple[TensorSet, TensorSet]:
    """Both sets standardised with the training set's mean and std: a float set at once, an
    integer one per batch (its stored bytes kept: :class:`TensorSet`)."""
    if np.issubdtype(x_tr.dtype, np.integer):
        norm = _moments(x_tr)
        return (
            TensorSet(torch.from_numpy(x_tr), torch.from_numpy(y_tr), norm),
            TensorSet(torch.from_numpy(x_te), torch.from_numpy(y_te), norm),
        )
    mean, std = float(x_tr.mean()), float(x_tr.std()) or 1.0
    return (
        TensorSet(torch.from_numpy((x_tr - mean) / std), torch.from_numpy(y_tr)),
        TensorSet(torch.from_numpy((x_te - mean) / std), torch.from_numpy(y_te)),
    )


def _moments(x: np.ndarray, rows: int = 1 << 14) -> tuple[float, float]:
    """(mean, std) of an integer array, in float64 over blocks of rows: exact sums for 8- and
    16-bit samples, and no float copy of the whole set (3.7 GB for a 925 MB uint8 one)."""
    total = squares = 0.0
    for i in range(0, len(x), rows):
        block = x[i : i + rows].astype(np.float64)
        total += float(block.sum())
        squares += float(np.square(block).sum())
    n = max(x.size, 1)
    mean = total / n
    return mean, float(np.sqrt(max(squares / n - mean * mean, 0.0))) or 1.0


# -- the user's datasets ----------------------------------------------------------------


def import_callable(spec: str, key: str):
    """``package.module:callable`` -> the callable; every failure names ``key``."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"config key '{key}': cannot import module {module_name!r} ({exc}); install your "
            "package in this environment or add its directory to PYTHONPATH"
        ) from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed while importing
        raise ConfigError(
            f"config key '{key}': importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    if not hasattr(module, attr):
        raise ConfigError(f"config key '{key}': module {module_name!r} has no attribute {attr!r}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise ConfigError(f"config key '{key}': {spec} is a {type(fn).__name__}, not a callable")
    return fn


def _user_datasets(spec: str):
    fn = import_callable(spec, "workload.dataset")
    try:
        got = fn()
    except Exception as exc:  # noqa: BLE001 - the user's code failed
        raise ConfigError(f"{KEY}: {spec}() raised {type(exc).__name__}: {exc}") from None
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise ConfigError(
            f"{KEY}: {spec}() must return (train_dataset, test_dataset); got {type(got).__name__}"
        )
    for name, ds in zip(("train", "test"), got):
        if not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")):
            raise ConfigError(
                f"{KEY}: {spec}(): the {name} dataset ({type(ds).__name__}) is not a map-style "
                "Dataset (it needs __getitem__ and __len__)"
            )
        if len(ds) == 0:
            raise ConfigError(f"{KEY}: {spec}(): the {name} dataset is empty")
    return got[0], got[1]


# -- the workload's data ----------------------------------------------------------------


@dataclass
class WorkloadData:
    """The training and test sets of ``workload.dataset``, with what the model needs to know."""

    name: str
    train: TorchDataset
    test: TorchDataset
    num_classes: int
    input_shape: tuple[int, ...]  # one sample, channels first: (C, L) or (C, H, W)
    # the in-memory training set's copy on a device, by (device, channels_last): made once
    _resident: dict = field(default_factory=dict, repr=False, compare=False)

    def resident_on(
        self, device: torch.device, channels_last: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The in-memory training set (samples, labels) on ``device``, copied there once for
        every replica made with this data (a probe job's points share one copy)."""
        key = (str(device), channels_last)
        if key not in self._resident:
            x, y = self.train.x.to(device), self.train.y.to(device)
            if channels_last and x.ndim == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            self._resident = {key: (x, y)}  # one device copy at a time
        return self._resident[key]

    @property
    def train_size(self) -> int:
        return len(self.train)

    def as_input(self, x: torch.Tensor) -> torch.Tensor:
        """A batch (or a sample) as the model takes it, where it is: an integer set's samples
        standardised here (on the device in training; :class:`TensorSet`); others as they are,
        and so is a batch already standardised (floating point): the device feed standardises
        its batches and the step moves them again, and standardised twice, BatchNorm's running
        statistics were those of other inputs than evaluation's (a uint8 set's test accuracy
        at chance: BENCHMARKS.md "On a GPU")."""
        norm = self.train.norm if isinstance(self.train, TensorSet) else None
        if norm is None or x.is_floating_point():
            return x
        mean, std = norm
        return (x.to(torch.float32) - mean) / std

    @property
    def test_size(self) -> int:
        return len(self.test)

    def describe(self) -> dict[str, Any]:
        return {
            "dataset": self.name,
            "train_samples": self.train_size,
            "test_samples": self.test_size,
            "num_classes": self.num_classes,
            "input_shape": list(self.input_shape),
        }


def stored_image_size(ds: TorchDataset) -> tuple[int, int] | None:
    """(width, height) of the first image an image folder stores, before any transform; None
    for datasets that are not read from image files."""
    samples = getattr(ds, "samples", None)
    if not samples:
        return None
    from PIL import Image  # torchvision's own image reader, present whenever an image folder is

    with Image.open(samples[0][0]) as img:
        return img.size


def _sample(ds: TorchDataset, spec: str, which: str) -> tuple[torch.Tensor, int]:
    try:
        item = ds[0]
    except Exception as exc:  # noqa: BLE001 - a broken file, a transform that fails
        raise ConfigError(
            f"{KEY}: reading the first {which} sample of {spec} failed: {type(exc).__name__}: {exc}"
        ) from None
    if not (isinstance(item, (tuple, list)) and len(item) == 2 and torch.is_tensor(item[0])):
        raise ConfigError(
            f"{KEY}: {spec}: a {which} sample must be (tensor, int); got {type(item).__name__}"
            + (
                f" of ({', '.join(type(v).__name__ for v in item)})"
                if isinstance(item, (tuple, list))
                else ""
            )
        )
    label = item[1]
    if not (
        isinstance(label, (int, np.integer))
        or (torch.is_tensor(label) and label.numel() == 1 and not label.is_floating_point())
    ):
        raise ConfigError(
            f"{KEY}: {spec}: a {which} label must be an integer class id; got {label!r}"
        )
    return item[0], int(label)


def _num_classes(ds: TorchDataset, spec: str) -> int:
    if getattr(ds, "classes", None) is not None:
        return len(ds.classes)
    targets = getattr(ds, "targets", None)
    if targets is None:  # scan the labels once (small sets only; give the dataset `classes`)
        targets = [int(ds[i][1]) for i in range(len(ds))]
    t = torch.as_tensor(targets)
    if t.numel() == 0 or int(t.min()) < 0:
        raise ConfigError(f"{KEY}: {spec}: labels must be class ids 0..K-1")
    return int(t.max()) + 1


def load(w: Workload, d: Data) -> WorkloadData:
    """The datasets of ``workload.dataset``; a mistake raises a ConfigError naming it."""
    spec = w.dataset
    if spec == "digits":
        train, test = _in_memory(*builtin_sets.digits(w.seed))
    elif spec == "mnist1d":
        train, test = _in_memory(*builtin_sets.mnist1d(w.mnist1d_samples, w.seed))
    elif spec.startswith("npz:"):
        train, test = _in_memory(*_npz(spec[4:]))
    elif spec.startswith("imagefolder:"):
        from tula.runtime.input.images import image_folder

        train, test = image_folder(spec[len("imagefolder:") :], d, KEY)
    elif ":" in spec:
        train, test = _user_datasets(spec)
    else:
        raise ConfigError(
            f"{KEY}: unknown dataset {spec!r} (digits, mnist1d, npz:<path>, imagefolder:<root>, "
            "package.module:callable)"
        )
    x, _ = _sample(train, spec, "training")
    x_test, _ = _sample(test, spec, "test")
    if x.shape != x_test.shape:
        raise ConfigError(
            f"{KEY}: {spec}: training samples are {tuple(x.shape)} but test samples "
            f"{tuple(x_test.shape)}; they must match"
        )
    if x.ndim not in (2, 3):
        raise ConfigError(
            f"{KEY}: {spec}: a sample must be (C, L) or (C, H, W), channels first; got "
            f"{tuple(x.shape)}"
        )
    k = max(_num_classes(train, spec), _num_classes(test, spec))
    return WorkloadData(spec, train, test, k, tuple(x.shape))


def load_config(cfg: Config) -> WorkloadData:
    return load(cfg.workload, cfg.data)
