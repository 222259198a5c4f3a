"""The files a ``workload.dataset`` names, checked where the workflow starts and by ``tula
check --config-only``: an ``npz:`` file with its four arrays, an ``imagefolder:`` root with
train/ and val/. Names only, nothing is loaded (no torch): a wrong path stops the run before
any job is queued; ``tula check`` then loads the data and checks its layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tula.config import Config, ConfigError

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


def check_npz_file(path: Path) -> list[str]:
    """An ``npz:`` dataset file exists, is an .npz archive and holds the four arrays (their
    names only: nothing is read). Returns the archive's array names."""
    key = "config key 'workload.dataset'"
    if not path.is_file():
        raise ConfigError(f"{key}: npz file {path} not found")
    try:
        with np.load(path) as z:
            files = list(z.files)
    except Exception as exc:  # noqa: BLE001 - not an npz archive
        raise ConfigError(f"{key}: {path} is not a readable .npz archive ({exc})") from None
    missing = [k for k in NPZ_KEYS if k not in files]
    if missing:
        raise ConfigError(
            f"{key}: {path}: missing array(s) {', '.join(missing)}; an npz dataset needs "
            f"{', '.join(NPZ_KEYS)}"
        )
    return files


def check_dataset_paths(cfg: Config) -> None:
    """The files a ``workload.dataset`` names exist (no loading, no torch): an ``npz:`` file with
    its four arrays, an ``imagefolder:`` root with train/ and val/. Run where the workflow starts
    and by ``tula check --config-only``, so a wrong path stops the run before any job is queued;
    ``tula check`` then loads the data and checks its layout."""
    spec = cfg.workload.dataset
    key = "config key 'workload.dataset'"
    if spec.startswith("npz:"):
        check_npz_file(Path(spec[4:]))
    elif spec.startswith("imagefolder:"):
        root = Path(spec[len("imagefolder:") :])
        for split in ("train", "val"):
            if not (root / split).is_dir():
                raise ConfigError(
                    f"{key}: image folder {root / split} not found; imagefolder:<root> needs "
                    "root/train/<class>/* and root/val/<class>/*"
                )
