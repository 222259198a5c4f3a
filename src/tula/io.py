"""Atomic file writes: a reader never sees a half-written results file.

Every writer goes through :func:`atomic_write`: the bytes land in a temporary file in the
same directory, are fsync'ed, and are renamed over the target (rename is atomic on POSIX
file systems, including the parallel file systems of SLURM clusters for same-directory
renames), and the directory is fsync'ed so the rename survives a crash. On any error the
temporary file is removed and the old target is left intact. The file gets the mode a plain
``open`` would give it (0666 less the umask: 0644 under umask 022), not mkstemp's 0600,
so a team sharing a project directory can read the results.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pandas as pd


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[Any]:
    """Open a temporary file beside ``path``; rename it over ``path`` on success."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600; the team reads results too
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def current_umask() -> int:
    """The process's umask, read without changing it (/proc on Linux; else set and restore)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (best effort: not every file system allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically. NaN/inf are written as null."""
    text = json.dumps(_finite(obj), indent=2, sort_keys=False, allow_nan=False) + "\n"
    with atomic_write(path) as fh:
        fh.write(text)


def read_json(path: str | os.PathLike) -> Any:
    """Read JSON, naming the file in the error if it is missing or malformed."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: file not found") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not valid JSON ({exc})") from None


def write_csv(path: str | os.PathLike, frame: pd.DataFrame) -> None:
    """Write a DataFrame as CSV (no index), atomically."""
    with atomic_write(path) as fh:
        frame.to_csv(fh, index=False)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_write(path, "wb") as fh:
        fh.write(data)


def _finite(obj: Any) -> Any:
    """Replace non-finite floats by None, recursively, so the JSON is strict."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
