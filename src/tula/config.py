"""Typed Tula configuration, loaded and validated once.

The JSON schema (``config.schema.yaml`` beside this file; ``workflow/config.schema.yaml``
links to it) holds every key, its default and its bounds. :func:`load` validates a YAML
file against it, fills defaults, applies the checks a schema cannot express (B divisible
by N, powers of two) and returns a frozen :class:`Config`. Every error names the key.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import yaml

SCHEMA_PATH = Path(__file__).with_name("config.schema.yaml")


class ConfigError(ValueError):
    """A user mistake in the config; the message names the key and what is wrong."""


@dataclass(frozen=True)
class Workload:
    model: str
    dataset: str
    mnist1d_samples: int
    epochs: int
    seed: int


@dataclass(frozen=True)
class Data:
    """Input pipeline (DataLoader) and image-folder transforms."""

    num_workers: int
    pin_memory: str | bool
    persistent_workers: bool
    prefetch_factor: int
    eval_batch_size: int
    image_size: int
    resize: int | None
    train_augment: str
    normalize: str


@dataclass(frozen=True)
class Grid:
    nodes: tuple[int, ...]
    batch_min: int
    batch_max: int
    workers_per_node: int


@dataclass(frozen=True)
class Constraints:
    min_nodes: int | None
    max_nodes: int | None
    min_batch: int | None
    max_batch: int | None


@dataclass(frozen=True)
class Pricing:
    model: str
    per_node_hour: float
    per_gb_hour: float
    currency: str


@dataclass(frozen=True)
class Hardware:
    device: str
    backend: str
    collective: str
    threads_per_worker: int
    device_memory_gb: float | None
    memory_margin: float

    @property
    def memory_budget_bytes(self) -> float | None:
        """Usable bytes per worker: device_memory_gb minus the safety margin."""
        if self.device_memory_gb is None:
            return None
        return self.device_memory_gb * 1e9 * (1.0 - self.memory_margin)


@dataclass(frozen=True)
class ProbeSettings:
    warmup_steps: int
    timed_steps: int
    timeout_s: float
    sweep_steps: int = 6
    noise_steps: int = 16
    exclusive: bool = True
    memory_batches: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TrainSettings:
    method: str
    optimizer: str
    lr: float
    momentum: float
    weight_decay: float
    lr_decay_epochs: tuple[int, ...]
    lr_decay_factor: float
    base_batch: int
    warmup_epochs: float
    ags_delta: float
    ags_small_batch: int
    ags_refresh_every_steps: int | None
    ags_s_min: float
    static_scale: float
    lars_eta: float
    lars_exclude_1d: bool
    polo_sync_epochs: int
    polo_averages_per_epoch: int
    precision: str
    channels_last: bool


# Paper §IV-B: SGD, momentum 0.9; LR 0.05 for ResNet50, 0.01 for the others; weight decay
# 1e-4 for MobileNetV3, 5e-4 for the others. small_cnn is not a paper model: 0.05 / 5e-4.
def family_defaults(model: str) -> tuple[float, float]:
    """(lr, weight_decay) of the paper's setup for the model's family."""
    if "resnet" in model or model == "small_cnn":
        return 0.05, 5e-4
    if "mobilenet" in model:
        return 0.01, 1e-4
    return 0.01, 5e-4


@dataclass(frozen=True)
class LaunchSettings:
    executor: str
    slurm_partition: str | None
    slurm_account: str | None
    slurm_additional: dict[str, Any]
    timeout_min: int | None
    mem_gb: float | None
    signal_delay_s: int
    max_requeues: int
    checkpoint_every_steps: int | None
    checkpoint_every_epochs: int | None
    keep_checkpoints: int
    poll_s: float


@dataclass(frozen=True)
class CompareWorkload:
    model: str
    dataset: str
    target_accuracy: float | None = None


@dataclass(frozen=True)
class CompareSettings:
    workloads: tuple[CompareWorkload, ...]
    batches: tuple[int, ...]
    methods: tuple[str, ...]
    seeds: int
    nodes: int
    epochs: int
    target_fraction: float = 0.95


@dataclass(frozen=True)
class Config:
    workload: Workload
    data: Data
    grid: Grid
    search: str
    objective: str
    knee_on: str
    constraints: Constraints
    pricing: Pricing
    hardware: Hardware
    probe: ProbeSettings
    train: TrainSettings
    launch: LaunchSettings
    compare: CompareSettings
    knee_rule: str = "marginal"
    knee_gain: float = 0.1

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (lists, not tuples) that validates against the schema."""
        return json.loads(json.dumps(asdict(self)))


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _validator_with_defaults():
    """Draft 2020-12 validator that fills ``default`` values while validating."""
    base = jsonschema.Draft202012Validator
    validate_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, sub_schema):
        if isinstance(instance, dict):
            for name, prop in properties.items():
                if "default" in prop:
                    instance.setdefault(name, copy.deepcopy(prop["default"]))
        yield from validate_properties(validator, properties, instance, sub_schema)

    return jsonschema.validators.extend(base, {"properties": set_defaults})


def _key(error: jsonschema.ValidationError) -> str:
    path = ".".join(str(p) for p in error.absolute_path)
    return path or "<top level>"


def validate(raw: dict[str, Any] | None, source: str = "config") -> dict[str, Any]:
    """Validate ``raw`` against the schema; return a copy with every default filled."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the config must be a mapping of keys, got {type(raw).__name__}")
    data = copy.deepcopy(raw)
    validator = _validator_with_defaults()(schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"  - config key '{_key(e)}': {e.message}" for e in errors]
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(lines))
    _check_semantics(data, source)
    return data


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def _check_semantics(d: dict[str, Any], source: str) -> None:
    """Checks the schema cannot express; each names its key."""
    g = d["grid"]
    problems: list[str] = []
    for key in ("batch_min", "batch_max"):
        if not _is_pow2(g[key]):
            problems.append(f"config key 'grid.{key}': {g[key]} is not a power of two")
    if g["batch_min"] > g["batch_max"]:
        problems.append(
            f"config key 'grid.batch_min': {g['batch_min']} is larger than grid.batch_max={g['batch_max']}"
        )
    for n in g["nodes"]:
        if g["batch_min"] % n:
            problems.append(
                f"config key 'grid.nodes': N={n} does not divide the global batch "
                f"B={g['batch_min']} (grid.batch_min); every B must split evenly over N workers"
            )
    c = d["constraints"]
    for lo, hi in (("min_nodes", "max_nodes"), ("min_batch", "max_batch")):
        if c[lo] is not None and c[hi] is not None and c[lo] > c[hi]:
            problems.append(f"config key 'constraints.{lo}': {c[lo]} is larger than constraints.{hi}={c[hi]}")
    cmp = d["compare"]
    for b in cmp["batches"]:
        if b % cmp["nodes"]:
            problems.append(f"config key 'compare.batches': B={b} is not divisible by compare.nodes={cmp['nodes']}")
    hw = d["hardware"]
    dt = d["data"]
    if dt["resize"] is not None and dt["resize"] < dt["image_size"]:
        problems.append(f"config key 'data.resize': {dt['resize']} is smaller than data.image_size={dt['image_size']}; "
                        "the test transform resizes, then center-crops image_size")
    if hw["backend"] == "nccl" and hw["device"] == "cpu":
        problems.append("config key 'hardware.backend': nccl needs CUDA devices but hardware.device is cpu")
    ln = d["launch"]
    if ln["checkpoint_every_steps"] is None and ln["checkpoint_every_epochs"] is None:
        problems.append("config key 'launch.checkpoint_every_epochs': null together with launch.checkpoint_every_steps "
                        "null means no checkpoint at all, and a preempted or OOM job would start over; set one")
    if problems:
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(f"  - {p}" for p in problems))


def from_dict(raw: dict[str, Any] | None, source: str = "config") -> Config:
    d = validate(raw, source)
    g, t = d["grid"], d["train"]
    return Config(
        workload=Workload(**d["workload"]),
        data=Data(**d["data"]),
        grid=Grid(
            nodes=tuple(sorted(g["nodes"])),
            batch_min=g["batch_min"],
            batch_max=g["batch_max"],
            workers_per_node=g["workers_per_node"],
        ),
        search=d["search"],
        objective=d["objective"],
        knee_on=d["knee_on"],
        knee_rule=d["knee_rule"],
        knee_gain=d["knee_gain"],
        constraints=Constraints(**d["constraints"]),
        pricing=Pricing(**d["pricing"]),
        hardware=Hardware(**d["hardware"]),
        probe=ProbeSettings(**{**d["probe"], "memory_batches": tuple(d["probe"]["memory_batches"] or ()) or None}),
        train=_train_settings(t, d["workload"]["model"]),
        launch=LaunchSettings(**d["launch"]),
        compare=CompareSettings(
            workloads=tuple(CompareWorkload(**w) for w in d["compare"]["workloads"]),
            batches=tuple(d["compare"]["batches"]),
            methods=tuple(d["compare"]["methods"]),
            seeds=d["compare"]["seeds"],
            nodes=d["compare"]["nodes"],
            epochs=d["compare"]["epochs"],
            target_fraction=d["compare"]["target_fraction"],
        ),
    )


def _train_settings(t: dict[str, Any], model: str) -> TrainSettings:
    lr, wd = family_defaults(model)
    return TrainSettings(**{**t, "lr": t["lr"] if t["lr"] is not None else lr,
                            "weight_decay": t["weight_decay"] if t["weight_decay"] is not None else wd,
                            "lr_decay_epochs": tuple(t["lr_decay_epochs"])})  # fmt: skip


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
        raise ConfigError(f"{key}: {path}: missing array(s) {', '.join(missing)}; an npz dataset needs "
                          f"{', '.join(NPZ_KEYS)}")  # fmt: skip
    return files


def check_dataset_paths(cfg: Config) -> None:
    """The files a ``workload.dataset`` names exist (no loading, no torch): an ``npz:`` file
    with its four arrays, an ``imagefolder:`` root with train/ and val/. Run where the workflow starts and by
    ``tula check --config-only``, so a wrong path stops the run before any job is queued;
    ``tula check`` then loads the data and checks its layout."""
    spec = cfg.workload.dataset
    key = "config key 'workload.dataset'"
    if spec.startswith("npz:"):
        check_npz_file(Path(spec[4:]))
    elif spec.startswith("imagefolder:"):
        root = Path(spec[len("imagefolder:"):])
        for split in ("train", "val"):
            if not (root / split).is_dir():
                raise ConfigError(f"{key}: image folder {root / split} not found; imagefolder:<root> needs "
                                  "root/train/<class>/* and root/val/<class>/*")  # fmt: skip


def load(path: str | os.PathLike) -> Config:
    """Read, validate and type a YAML (or JSON) config file."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML ({exc})") from None
    return from_dict(raw, source=str(p))
