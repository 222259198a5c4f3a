"""What the equations take: small named records, each built from the config once, at the stage
boundary (:mod:`tula.model_inputs`), never the config itself. A record holds only the
figures its equations read; a function of :mod:`tula.model` takes the records it needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GridSpec:
    """The candidate grid (§III-A.2): the worker counts N, the global batches B from
    ``batch_min`` doubling to ``batch_max``, the workers one node runs, and which points get
    probed (``search``: partial, the corners; full, every point that fits). ``swept``: a probe
    job times the compute curve between its points (Tula's own worker's sweep); a user's script
    cannot, as it runs at the one batch it was started with (:func:`tula.model.grid.search_set`
    probes the points between instead)."""

    workers: tuple[int, ...]
    batch_min: int
    batch_max: int
    workers_per_node: int = 1
    search: str = "partial"
    swept: bool = True
    # train.accumulate: "auto" (a point past b_max runs as micro-batches), or a fixed k
    accumulate: str | int = 1


@dataclass(frozen=True)
class Price:
    """A price (Eq. 4b): the pricing model billed (worker_hour, node_hour, memory), each
    model's rate, the currency, and the workers one node runs (node_hour bills whole nodes)."""

    model: str = "worker_hour"
    per_worker_hour: float = 1.0
    per_node_hour: float | None = None
    per_gb_hour: float = 0.0
    currency: str = "USD"
    workers_per_node: int = 1


@dataclass(frozen=True)
class Bounds:
    """The user's bounds on the choice (None: none)."""

    min_workers: int | None = None
    max_workers: int | None = None
    min_batch: int | None = None
    max_batch: int | None = None


@dataclass(frozen=True)
class Goal:
    """What the choice minimises (§III-A.3): the objective, the knee's curve, rule and gain,
    the bounds, and what the accuracy objectives rest on (the production run's epochs reach
    the target accuracy at ``base_batch``)."""

    objective: str = "knee"
    knee_on: str = "time"
    knee_rule: str = "marginal"
    knee_gain: float = 0.1
    bounds: Bounds = Bounds()
    epochs: int = 1
    base_batch: int = 256

    def __post_init__(self) -> None:
        for key, value in (
            ("objective", self.objective),
            ("knee_on", self.knee_on),
            ("knee_rule", self.knee_rule),
        ):
            if value not in GOAL_NAMES[key]:
                raise ValueError(f"{key}: {value!r} is not one of {', '.join(GOAL_NAMES[key])}")


# the names each of Goal's words may take (the config's schema checks them first)
GOAL_NAMES = {
    "objective": (
        "time",
        "cost",
        "time_to_result",
        "knee",
        "time_to_accuracy",
        "cost_to_accuracy",
    ),
    "knee_on": ("time", "cost"),
    "knee_rule": ("marginal", "kneedle"),
}


@dataclass(frozen=True)
class JobExtras:
    """What a production job pays besides its steps that the settings decide: its checkpoints'
    cadence, and whether the step is compiled (a new batch shape then builds its kernels)."""

    checkpoint_every_steps: int | None = None
    checkpoint_every_epochs: int | None = 1
    compiled: bool = False


@dataclass(frozen=True)
class Planning:
    """Everything a grid's predictions and their choice rest on: the grid, the price, the
    goal and the job's extras (:func:`tula.model.predictions.predict`)."""

    grid: GridSpec
    price: Price
    goal: Goal
    extras: JobExtras = JobExtras()


@dataclass(frozen=True)
class Device:
    """The device a plan is made for: its memory budget per worker (None: unbounded), the
    named GPU (a name of :mod:`tula.gpus` or its figures; None: not named) and the step's
    precision (fp32, bf16, ...)."""

    memory_budget_bytes: float | None = None
    gpu: str | dict[str, Any] | None = None
    precision: str = "fp32"


@dataclass(frozen=True)
class ProbeSteps:
    """One probe's steps as the config sets them: warm-up and timed steps, its time limit, the
    precision its timing aims at, and the local batches of the memory probe (None: derived
    from the grid)."""

    warmup_steps: int = 3
    timed_steps: int = 20
    timeout_s: float = 600.0
    precision: float = 0.02
    memory_batches: tuple[int, ...] | None = None
