"""What the Snakemake workflow asks of Tula, beside the stages it runs: the merged config
the jobs read, the conda environment file, and each rule's rerun trigger.

Snakemake merges configfiles and ``--config`` overrides in memory; :func:`snapshot` writes
that merged, validated config to ``.snakemake/tula/config.json``, the file every job reads
(also on SLURM nodes). :func:`stage_settings` is each rule's ``settings`` param: Snakemake
re-runs a rule when the config values its output depends on change, and only then.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from tula.config import Config, validate
from tula.io import atomic_write


def conda_env(template: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Write ``template`` (a conda environment file) to ``path`` with every relative pip path
    (``-e ..``, ``./pkg``) made absolute, resolved from the template's own directory.

    Snakemake copies an environment file under ``.snakemake/conda/`` before it creates the
    environment, so a relative path in it would point elsewhere; the written file installs
    Tula from this checkout wherever it is created. Written only on change."""
    src = Path(template).resolve()
    env = yaml.safe_load(src.read_text())
    for dep in env.get("dependencies", []):
        if isinstance(dep, dict) and "pip" in dep:
            dep["pip"] = [_absolute_pip_path(str(req), src.parent) for req in dep["pip"]]
    text = (
        f"# Written from {src} (relative pip paths made absolute); edit that file instead.\n"
        + yaml.safe_dump(env, sort_keys=False)
    )
    p = Path(path)
    if not p.exists() or p.read_text() != text:
        with atomic_write(p) as fh:
            fh.write(text)
    return p.resolve()


def _absolute_pip_path(req: str, base: Path) -> str:
    flag, _, target = req.partition(" ") if req.startswith("-e ") else ("", "", req)
    if target.startswith((".", "/")):
        target = str((base / target).resolve())
    return f"{flag} {target}" if flag else target


def snapshot(cfg: Config, path: str | os.PathLike) -> Path:
    """Write the resolved config ``cfg`` to ``path`` (only when it changed): every key the
    jobs read, as ``tula check`` resolves it -- the device and backend decided
    (:mod:`tula.devices`), the memory budget and where it came from, the model's family
    defaults -- so no job re-derives anything from the raw YAML.

    Snakemake merges configfiles and ``--config`` overrides in memory; the jobs it starts
    (locally or on SLURM nodes) read this file. Written atomically and only on change, so
    re-parsing the Snakefile is harmless.
    """
    text = json.dumps(validate(cfg.to_dict()), indent=2, sort_keys=True) + "\n"
    p = Path(path)
    if not p.exists() or p.read_text() != text:
        with atomic_write(p) as fh:
            fh.write(text)
    return p


# Which config keys each stage's output depends on. Snakemake re-runs a rule when these
# change (params rerun trigger), and only then: a new price re-runs select, not probes.
_WORKLOAD = (
    "workload.model",
    "workload.dataset",
    "workload.mnist1d_samples",
    "workload.seed",
    "data",
)
# What makes the timed step what it is (the optimizer and its arguments, the loss and the
# metric the step computes among them); the learning rate and its schedule do not: probes
# are bought once, and lr, schedule*, lr_decay_*, warmup_epochs, base_batch, epochs,
# objective and pricing reuse every probe.
_STEP = (
    "hardware.device",
    "hardware.backend",
    "hardware.threads_per_worker",
    "hardware.comm_env",
    "cluster",
    "train.method",
    "train.optimizer",
    "train.optimizer_args",
    "train.loss",
    "train.label_smoothing",
    "train.metric",
    "train.momentum",
    "train.weight_decay",
    "train.precision",
    "train.channels_last",
    "train.ags_delta",
    "train.ags_small_batch",
    "train.ags_refresh_every_steps",
    "train.ags_s_min",
    "train.static_scale",
    "train.lars_eta",
    "train.lars_exclude_1d",
    "train.polo_sync_epochs",
    "train.polo_averages_per_epoch",
    "train.compile",
)
_STAGE_KEYS: dict[str, tuple[str, ...]] = {
    "check": _WORKLOAD,
    # one probe job: its own (N, B) is its wildcards; the rest of the grid is not its business
    # (adding a batch or a worker count runs only the new probes)
    "probe": (
        *_WORKLOAD,
        *_STEP,
        "probe.warmup_steps",
        "probe.timed_steps",
        "probe.timeout_s",
        "probe.sweep_steps",
        "probe.noise_steps",
        "probe.exclusive",
        "probe.block_steps",
        "probe.precision",
        "probe.time_budget_s",
        "probe.input_batches",
    ),
    "fit": (
        "search",
        "cluster",
        "hardware.collective",
        "hardware.device_memory_gb",
        "hardware.memory_margin",
        "probe.no_sync_fallback",
    ),
    "predict": (
        "workload",
        "grid",
        "cluster",
        "pricing",
        "hardware.device_memory_gb",
        "hardware.memory_margin",
        "train.base_batch",
        "launch.checkpoint_every_steps",
        "launch.checkpoint_every_epochs",
    ),
    # one worker: the batches it measures follow the grid (tula.model.memory.probe_batches); the
    # probes read its b_max but do not re-run when it re-runs (ancient input, rules/probe.smk)
    "memprobe": (*_WORKLOAD, *_STEP, "grid", "probe.memory_batches"),
    "select": (
        "objective",
        "knee_on",
        "knee_rule",
        "knee_gain",
        "constraints",
        "pricing",
        "cluster",
    ),
    "launch": (
        "workload",
        "data",
        "hardware.device",
        "hardware.backend",
        "hardware.threads_per_worker",
        "hardware.comm_env",
        "cluster",
        "train",
    ),
    # one run of the suite: not the lists of cells (adding a batch trains only the new runs)
    "compare_run": (
        "compare.workers",
        "compare.epochs",
        "workload.mnist1d_samples",
        "data",
        "hardware",
        "cluster",
        "train",
    ),
    "compare": ("compare",),
}


def stage_settings(cfg: Config, stage: str) -> str:
    """The config values ``stage`` depends on, as a stable JSON string."""
    d = cfg.to_dict()
    # which partitions are listed is not a stage's business: each partition's own stages see
    # their own config, and a config without the list re-runs nothing
    for key in ("partitions", "partition"):
        d["cluster"].pop(key, None)
    picked: dict[str, Any] = {}
    for key in _STAGE_KEYS[stage]:
        section, _, name = key.partition(".")
        picked[key] = d[section][name] if name else d[section]
    return json.dumps(picked, sort_keys=True)
