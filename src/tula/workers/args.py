"""The command line of a worker entry point (``python -m tula.runtime.probe.probe_worker`` /
``memprobe_worker``)."""

from __future__ import annotations

import argparse


def parse_worker_args(
    prog: str,
    argv: list[str] | None = None,
    batch_flag: str = "--global-batch",
    batch_list: bool = False,
) -> argparse.Namespace:
    """Arguments of a worker entry point (``python -m tula.runtime.probe.probe_worker`` /
    ``memprobe_worker``); with ``batch_list`` the batch flag takes a comma-separated list."""
    p = argparse.ArgumentParser(
        prog=f"python -m {prog}", description="One worker, started by torchrun or srun."
    )
    p.add_argument("--config", required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument(
        batch_flag,
        required=True,
        type=(lambda s: [int(v) for v in s.split(",")]) if batch_list else int,
    )
    p.add_argument("--result-dir", required=True)
    p.add_argument(
        "--memory-probe",
        default=None,
        help="results/memory_probe.json: b_max for the compute sweep",
    )
    p.add_argument(
        "--attempt",
        type=int,
        default=1,
        help="which launch of this probe (one more after a lost rank)",
    )
    return p.parse_args(argv)
