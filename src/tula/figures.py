"""Matplotlib for Tula's figures, off-screen (the Agg backend: a login node has no display),
and the one way a figure is written: a PNG, atomically."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from tula.io import write_bytes

__all__ = ["plt", "save_figure"]


def save_figure(fig: Figure, path: str | Path) -> None:
    """Write ``fig`` as a PNG (atomically) and close it; its artists stay readable."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    write_bytes(path, buf.getvalue())
