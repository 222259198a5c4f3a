"""Dataset registry: offline data only.

- ``digits``: scikit-learn's 8x8 handwritten digits (ships inside scikit-learn), 1 x 8 x 8.
- ``mnist1d``: the MNIST-1D benchmark generated locally by the `mnist1d` package, 1 x 40.
- ``npz:<path>``: a user's arrays ``x_train, y_train, x_test, y_test``; x is (n, L),
  (n, H, W), (n, C, L) or (n, C, H, W) (channels first); y holds class ids 0..K-1.

Inputs are standardised with the training set's mean and standard deviation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tula.config import ConfigError, Workload


@dataclass
class Dataset:
    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample, channels first: (C, L) or (C, H, W)."""
        return tuple(self.x_train.shape[1:])

    @property
    def train_size(self) -> int:
        return int(self.x_train.shape[0])


def _split(x: np.ndarray, y: np.ndarray, seed: int, test_fraction: float = 0.2):
    from sklearn.model_selection import train_test_split

    return train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)


def _digits(seed: int):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = d.images.astype(np.float32)[:, None, :, :]  # (n, 1, 8, 8)
    return _split(x, d.target.astype(np.int64), seed)


def _mnist1d(samples: int, seed: int):
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = samples
    args.seed = seed
    d = make_dataset(args)
    return (
        d["x"].astype(np.float32)[:, None, :],
        d["x_test"].astype(np.float32)[:, None, :],
        np.asarray(d["y"], dtype=np.int64),
        np.asarray(d["y_test"], dtype=np.int64),
    )


NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


def _npz(path: str):
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config key 'workload.dataset': npz file {p} not found")
    with np.load(p) as z:
        missing = [k for k in NPZ_KEYS if k not in z.files]
        if missing:
            raise ConfigError(
                f"{p}: missing array(s) {', '.join(missing)}; an npz dataset needs {', '.join(NPZ_KEYS)}"
            )
        arrays = {k: z[k] for k in NPZ_KEYS}
    x_tr, x_te = (arrays[k].astype(np.float32) for k in ("x_train", "x_test"))
    y_tr, y_te = (arrays[k] for k in ("y_train", "y_test"))
    for key, x, y in (("train", x_tr, y_tr), ("test", x_te, y_te)):
        if x.ndim not in (2, 3, 4):
            raise ConfigError(f"{p}: x_{key} must be (n, L), (n, H, W), (n, C, L) or (n, C, H, W); got {x.shape}")
        if y.ndim != 1 or len(y) != len(x):
            raise ConfigError(f"{p}: y_{key} must be 1-D with one label per row of x_{key}; got {y.shape}")
        if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
            raise ConfigError(f"{p}: y_{key} must hold non-negative integer class ids")
    if x_tr.shape[1:] != x_te.shape[1:]:
        raise ConfigError(f"{p}: x_train samples {x_tr.shape[1:]} and x_test samples {x_te.shape[1:]} differ")
    if x_tr.ndim == 2 or x_tr.ndim == 3 and x_tr.shape[1] > 4:
        # (n, L) -> (n, 1, L);  (n, H, W) with H > 4 is an image without a channel axis.
        x_tr, x_te = x_tr[:, None], x_te[:, None]
    return x_tr, x_te, y_tr.astype(np.int64), y_te.astype(np.int64)


def load_dataset(spec: str, *, mnist1d_samples: int = 4000, seed: int = 0) -> Dataset:
    """Load a dataset by its config name (``workload.dataset``)."""
    if spec == "digits":
        x_tr, x_te, y_tr, y_te = _digits(seed)
    elif spec == "mnist1d":
        x_tr, x_te, y_tr, y_te = _mnist1d(mnist1d_samples, seed)
    elif spec.startswith("npz:"):
        x_tr, x_te, y_tr, y_te = _npz(spec[4:])
    else:
        raise ConfigError(f"config key 'workload.dataset': unknown dataset {spec!r} (digits, mnist1d, npz:<path>)")
    mean, std = float(x_tr.mean()), float(x_tr.std()) or 1.0
    num_classes = int(max(y_tr.max(), y_te.max())) + 1
    return Dataset(
        name=spec,
        x_train=torch.from_numpy((x_tr - mean) / std),
        y_train=torch.from_numpy(y_tr),
        x_test=torch.from_numpy((x_te - mean) / std),
        y_test=torch.from_numpy(y_te),
        num_classes=num_classes,
    )


def load_workload_dataset(w: Workload) -> Dataset:
    """The dataset of the config's ``workload`` section."""
    return load_dataset(w.dataset, mnist1d_samples=w.mnist1d_samples, seed=w.seed)
