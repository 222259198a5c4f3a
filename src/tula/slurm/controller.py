"""Asking the SLURM controller: one command's output, or :class:`ClusterUnreadable` saying why
there is none (no command on PATH, or it failed)."""

from __future__ import annotations

import shutil
import subprocess


class ClusterUnreadable(Exception):
    """No SLURM controller to ask (no scontrol on PATH, or it does not answer)."""


def ask(cmd: list[str]) -> str:
    """``cmd``'s standard output; :class:`ClusterUnreadable` when it is not on PATH or fails."""
    if not shutil.which(cmd[0]):
        raise ClusterUnreadable(f"{cmd[0]} is not on PATH (not on a SLURM login node?)")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise ClusterUnreadable(f"`{' '.join(cmd)}` failed: {(out.stderr or out.stdout).strip()}")
    return out.stdout
