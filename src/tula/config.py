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
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from tula import config_rules, partitions

SCHEMA_PATH = Path(__file__).with_name("config.schema.yaml")


def metric_name(spec: str) -> str:
    """``train.metric``'s name: ``accuracy``, or the callable's of ``package.module:callable``."""
    return spec.rpartition(":")[2]


class ConfigError(ValueError):
    """A user mistake in the config; the message names the key and what is wrong."""


@dataclass(frozen=True)
class Workload:
    model: str
    dataset: str
    mnist1d_samples: int
    epochs: int
    seed: int
    script: str | None = None  # the user's own training script (tula.script)
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Data:
    """Input pipeline (DataLoader) and image-folder transforms."""

    num_workers: int | str  # a count, or "auto" (runtime.input.loader.loader_workers)
    on_device: str | bool
    pin_memory: str | bool
    persistent_workers: bool
    prefetch_factor: int
    eval_batch_size: int
    image_size: int
    resize: int | None
    train_augment: str
    normalize: str
    decode: str = "auto"  # auto | cpu | gpu (runtime.input.images.decode_on_device)


@dataclass(frozen=True)
class Grid:
    workers: tuple[int, ...]
    batch_min: int
    batch_max: int


@dataclass(frozen=True)
class Cluster:
    workers_per_node: int
    netlab: str | None = None
    partitions: tuple[dict[str, Any], ...] = ()  # entries (tula.partitions)


@dataclass(frozen=True)
class Constraints:
    min_workers: int | None
    max_workers: int | None
    min_batch: int | None
    max_batch: int | None


@dataclass(frozen=True)
class Pricing:
    model: str
    per_worker_hour: float
    per_node_hour: float | None
    per_gb_hour: float
    currency: str


@dataclass(frozen=True)
class Hardware:
    device: str
    backend: str
    collective: str
    threads_per_worker: int
    comm_env: dict[str, str]
    device_memory_gb: float | None
    memory_margin: float
    device_why: str = ""  # written by the workflow with its decision of `auto` (tula.devices)
    device_memory_why: str = ""  # where device_memory_gb came from (config_rules.device_memory)
    gpu: str | dict[str, Any] | None = None  # a name of tula.gpus.TABLE, or a GPU's figures

    @property
    def memory_budget_bytes(self) -> float | None:
        """Usable bytes per worker: device_memory_gb minus the safety margin."""
        if self.device_memory_gb is None:
            return None
        return self.device_memory_gb * 1e9 * (1.0 - self.memory_margin)

    def describe_memory(self) -> str:
        """The memory budget per worker and where it came from, in one phrase."""
        if self.memory_budget_bytes is None:
            return f"no memory bound per worker ({self.device_memory_why})"
        return (
            f"{self.memory_budget_bytes / 1e9:.1f} GB per worker ({self.device_memory_why}, "
            f"less hardware.memory_margin {100 * self.memory_margin:g} %)"
        )


@dataclass(frozen=True)
class ProbeSettings:
    warmup_steps: int
    timed_steps: int
    timeout_s: float
    sweep_steps: int = 6
    noise_steps: int = 16
    exclusive: bool = True
    block_steps: int | None = None
    precision: float = 0.02
    time_budget_s: float = 30.0
    input_batches: int = 10
    memory_batches: tuple[int, ...] | None = None
    no_sync_fallback: bool = False


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
    warmup_epochs: float | None
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
    compile: str = "off"
    optimizer_args: dict[str, Any] = field(default_factory=dict)
    schedule: str = "step"
    schedule_args: dict[str, Any] = field(default_factory=dict)
    label_smoothing: float = 0.0
    loss: str = "cross_entropy"
    metric: str = "accuracy"
    metric_args: dict[str, Any] = field(default_factory=dict)
    metric_goal: str = "max"
    grad_clip_norm: float | None = None
    ema_decay: float | None = None
    accumulate: str | int = "auto"  # micro-batches a step takes (tula.model.grid.micro_steps)
    method_auto: bool = False  # train.method: auto, `method` its rule's (auto_method)
    no_weight_decay: tuple[str, ...] | str = ()

    def recipe(self) -> dict[str, Any]:
        """The way of training as the results record it (final.json, workload.json)."""
        return {
            "method": self.method,
            "method_reason": self.method_reason,
            "optimizer": self.optimizer,
            "optimizer_args": dict(self.optimizer_args),
            "schedule": self.schedule,
            "warmup_epochs": self.warmup,
            "loss": self.loss,
            "label_smoothing": self.label_smoothing,
            "metric": self.metric,
            "metric_args": dict(self.metric_args),
            "metric_goal": self.metric_goal,
            "grad_clip_norm": self.grad_clip_norm,
            "ema_decay": self.ema_decay,
            "no_weight_decay": self.no_weight_decay,
        }

    @property
    def method_reason(self) -> str:
        """Why the run trains with ``method``: the config named it, or ``auto``'s rule."""
        if not self.method_auto:
            return f"train.method: {self.method}, as the config names it"
        return config_rules.auto_method(self.optimizer)[1]

    @property
    def warmup(self) -> float:
        """The warm-up in epochs: train.warmup_epochs, or unset the paper's 5 for the baselines
        that warm up (lrs, lars, polo) and none for the others."""
        if self.warmup_epochs is not None:
            return self.warmup_epochs
        return 5.0 if self.method in ("lrs", "lars", "polo") else 0.0


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
    monitor_every_steps: int | str | None = "auto"
    replan: str = "record"
    node_wait_min: float = 10.0


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
    workers: int
    epochs: int
    target_fraction: float = 0.95


@dataclass(frozen=True)
class Config:
    workload: Workload
    data: Data
    grid: Grid
    cluster: Cluster
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
        """Plain dict (lists, not tuples) that validates against the schema (and reads back as
        this config: a resolved ``train.method: auto`` is written as ``auto``)."""
        d = json.loads(json.dumps(asdict(self)))
        if d["train"].pop("method_auto"):
            d["train"]["method"] = "auto"
        return d


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def validate(raw: dict[str, Any] | None, source: str = "config") -> dict[str, Any]:
    """Validate ``raw`` against the schema; return a copy with every default filled."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: the config must be a mapping of keys, got {type(raw).__name__}"
        )
    renamed = config_rules.renamed_keys(raw)
    if renamed:
        raise ConfigError(
            f"{source}: invalid configuration\n" + "\n".join(f"  - {p}" for p in renamed)
        )
    data = copy.deepcopy(raw)
    gpu_problem = config_rules.device_memory(data)
    if gpu_problem:
        raise ConfigError(f"{source}: invalid configuration\n  - {gpu_problem}")
    if isinstance(data.get("launch"), dict) and data["launch"].get("replan") is False:
        data["launch"]["replan"] = "off"  # YAML reads an unquoted `off` as false
    validator = config_rules.defaults_validator()(schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"  - {config_rules.schema_problem(e)}" for e in errors]
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(lines))
    problems = config_rules.problems(data) + partitions.problems(data, validate)
    if problems:
        raise ConfigError(
            f"{source}: invalid configuration\n" + "\n".join(f"  - {p}" for p in problems)
        )
    return data


def from_dict(raw: dict[str, Any] | None, source: str = "config") -> Config:
    d = validate(raw, source)
    g, t = d["grid"], d["train"]
    return Config(
        workload=Workload(**{**d["workload"], "args": tuple(d["workload"]["args"])}),
        data=Data(**d["data"]),
        grid=Grid(
            workers=tuple(sorted(g["workers"])),
            batch_min=g["batch_min"],
            batch_max=g["batch_max"],
        ),
        cluster=Cluster(**{**d["cluster"], "partitions": tuple(d["cluster"]["partitions"])}),
        search=d["search"],
        objective=d["objective"],
        knee_on=d["knee_on"],
        knee_rule=d["knee_rule"],
        knee_gain=d["knee_gain"],
        constraints=Constraints(**d["constraints"]),
        pricing=Pricing(**d["pricing"]),
        hardware=Hardware(
            **{
                **d["hardware"],
                "comm_env": {k: str(v) for k, v in d["hardware"]["comm_env"].items()},
            }
        ),
        probe=ProbeSettings(
            **{**d["probe"], "memory_batches": tuple(d["probe"]["memory_batches"] or ()) or None}
        ),
        train=_train_settings(t, d["workload"]["model"]),
        launch=LaunchSettings(**d["launch"]),
        compare=CompareSettings(
            workloads=tuple(CompareWorkload(**w) for w in d["compare"]["workloads"]),
            batches=tuple(d["compare"]["batches"]),
            methods=tuple(d["compare"]["methods"]),
            seeds=d["compare"]["seeds"],
            workers=d["compare"]["workers"],
            epochs=d["compare"]["epochs"],
            target_fraction=d["compare"]["target_fraction"],
        ),
    )


def _train_settings(t: dict[str, Any], model: str) -> TrainSettings:
    lr, wd = config_rules.family_defaults(model)
    return TrainSettings(
        **{
            **t,
            "method": config_rules.auto_method(t["optimizer"])[0]
            if t["method"] == "auto"
            else t["method"],
            "method_auto": t["method"] == "auto",
            "lr": t["lr"] if t["lr"] is not None else lr,
            "weight_decay": t["weight_decay"] if t["weight_decay"] is not None else wd,
            "lr_decay_epochs": tuple(t["lr_decay_epochs"]),
            "no_weight_decay": (
                tuple(t["no_weight_decay"])
                if isinstance(t["no_weight_decay"], list)
                else t["no_weight_decay"]
            ),
            "compile": {True: "on", False: "off"}.get(t["compile"], t["compile"]),
        }
    )


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
