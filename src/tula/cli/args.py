"""Arguments more than one `tula` subcommand takes."""

from __future__ import annotations

import argparse


def cfg_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        required=True,
        metavar="YAML",
        help="Tula config (workflow/config.yaml, or the "
        "snapshot Snakemake passes); validated on load",
    )


def executor_args(s: argparse.ArgumentParser) -> None:
    """Where `tula launch` (and each run of the suite) submits its job: Snakemake passes these."""
    s.add_argument(
        "--executor-hint",
        choices=["local", "slurm"],
        help="what launch.executor: auto means (the rule passes Snakemake's executor)",
    )
    s.add_argument(
        "--timeout-min",
        type=int,
        help="job wall time when launch.timeout_min is null (rule runtime)",
    )
    s.add_argument(
        "--slurm-partition", help="partition when launch.slurm_partition is null (profile's)"
    )
    s.add_argument("--slurm-account", help="account when launch.slurm_account is null (profile's)")
