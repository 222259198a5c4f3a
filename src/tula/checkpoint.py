"""Training checkpoints that a crash, a preemption or a torn write cannot corrupt.

A checkpoint is two files in ``results/train/checkpoints/``::

    step-000000120.pt     torch.save of the state: named parts, each its owner's state_dict
                          (model, optimizer, ags, scheduler, scaler, position, evaluation,
                          ledger; each rank's RNG state and sums), and the batch
    step-000000120.json   manifest: step, epoch, batch, byte size and SHA-256 of the .pt

Both are written atomically (temporary file, fsync, rename, directory fsync), the manifest
last, so a checkpoint without a manifest is an interrupted write and is ignored. On load
the newest checkpoint whose size and checksum match its manifest and that unpickles is
used; a damaged one is reported with a warning and the previous one is tried. After every
write only the newest ``keep`` checkpoints are kept.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tula.io import read_json, write_bytes, write_json

# torch is imported inside the functions that touch tensors (they run in the workers, where it is
# loaded already): `tula launch` reads manifests without paying its start-up.

FORMAT = 2  # 2: named parts, each its owner's state_dict (1: one flat dict)
_NAME = re.compile(r"^step-(\d{9})\.json$")


@dataclass(frozen=True)
class Checkpointing:
    """How a training worker checkpoints (None for runs that do not)."""

    directory: Path
    fingerprint: str  # config + N + selected B: a checkpoint of another run is never resumed
    every_steps: int | None
    every_epochs: int | None
    keep: int
    attempt: int = 1


def fingerprint(train_settings: str, workers: int, global_batch: int) -> str:
    """What a checkpoint must match to be resumed: the training settings (the JSON of
    ``pipeline.stage_settings(cfg, "launch")``), N, and the B the run was launched at
    (relaunches at a smaller B keep the launch's fingerprint)."""
    text = json.dumps([train_settings, workers, global_batch])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Loaded:
    state: dict[str, Any]
    path: Path
    step: int


def _stem(step: int) -> str:
    return f"step-{step:09d}"


def save(
    directory: str | os.PathLike,
    state: dict[str, Any],
    step: int,
    keep: int = 2,
    after_write: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``state`` as the checkpoint of ``step``; prune to the newest ``keep``.

    ``after_write`` (fault injection only) is called with the .pt path once both files
    are in place, before pruning.
    """
    d = Path(directory)
    data = to_bytes({**state, "format": FORMAT, "step": step})
    pt = d / f"{_stem(step)}.pt"
    write_bytes(pt, data)
    where = state.get("position", {})
    meta = {k: where[k] for k in ("epoch", "offset") if k in where}
    meta.update(
        (k, state[k]) for k in ("global_batch", "workers", "fingerprint", "complete") if k in state
    )
    write_json(
        d / f"{_stem(step)}.json",
        {
            "format": FORMAT,
            "step": step,
            **meta,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        },
    )
    if after_write is not None:
        after_write(pt)
    prune(d, keep)
    return pt


def to_bytes(obj: Any) -> bytes:
    """torch.save into memory (so the bytes can be checksummed, then written atomically)."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def from_bytes(data: bytes) -> Any:
    """Our own checkpoint (full pickle, onto the CPU): only ever files this run wrote."""
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def manifests(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, manifest path) of every checkpoint, newest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found, reverse=True)


def prune(directory: str | os.PathLike, keep: int) -> None:
    for _, manifest in manifests(directory)[keep:]:
        # manifest first: a half-pruned checkpoint reads as unwritten
        manifest.unlink(missing_ok=True)
        manifest.with_suffix(".pt").unlink(missing_ok=True)


def _check(manifest: Path) -> tuple[dict[str, Any] | None, str]:
    """The checkpoint's state, or None and why it cannot be used."""
    pt = manifest.with_suffix(".pt")
    try:
        meta = read_json(manifest)
        data = pt.read_bytes()
    except (OSError, ValueError) as exc:
        return None, str(exc)
    if len(data) != meta.get("bytes"):
        return (
            None,
            f"{pt.name} has {len(data)} bytes, its manifest says {meta.get('bytes')} (torn or "
            "truncated write)",
        )
    if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        return None, f"{pt.name}: SHA-256 does not match its manifest (corrupted)"
    try:
        state = from_bytes(data)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means: not usable
        return None, f"{pt.name} does not load ({type(exc).__name__}: {exc})"
    if state.get("format") != FORMAT:
        return (
            None,
            f"{pt.name}: checkpoint format {state.get('format')!r}, this Tula reads {FORMAT}",
        )
    return state, ""


def newest_intact(directory: str | os.PathLike) -> int | None:
    """Step of the newest checkpoint whose size and checksum match its manifest (no unpickling:
    cheap enough for the login node before a job is submitted)."""
    for step, manifest in manifests(directory):
        try:
            meta, data = read_json(manifest), manifest.with_suffix(".pt").read_bytes()
        except (OSError, ValueError):
            continue
        if len(data) == meta.get("bytes") and hashlib.sha256(data).hexdigest() == meta.get(
            "sha256"
        ):
            return step
    return None


def load_latest(
    directory: str | os.PathLike, accept: Callable[[dict[str, Any]], str] | None = None
) -> tuple[Loaded | None, list[str]]:
    """The newest usable checkpoint (None when there is none), and a warning per skipped one.

    ``accept(state)`` may return a reason to refuse a checkpoint (e.g. written for another
    configuration); refused and damaged checkpoints are skipped with a warning each.
    """
    warnings: list[str] = []
    for step, manifest in manifests(directory):
        state, why = _check(manifest)
        if state is not None and accept is not None:
            why = accept(state)
            state = None if why else state
        if state is None:
            warnings.append(f"checkpoint of step {step} skipped: {why}")
            continue
        return Loaded(state, manifest.with_suffix(".pt"), step), warnings
    return None, warnings


def truncate(path: str | os.PathLike) -> None:
    """Fault injection: cut a written checkpoint to half its size (a torn write)."""
    p = Path(path)
    size = p.stat().st_size
    with open(p, "r+b") as fh:
        fh.truncate(size // 2)
    print(f"[fault] truncated {p} from {size} to {size // 2} bytes", file=sys.stderr, flush=True)


def rng_state() -> dict[str, Any]:
    """Every random generator a training step may draw from, on this process."""
    import torch

    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def set_rng_state(s: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(s["torch"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
