"""selection.json, typed: the one place that says what a choice holds. :class:`Selection` is
built once by the choice (:func:`tula.model.choice.select`), given its robustness by
``tula select`` (:class:`Robustness`, :mod:`tula.model.robust`) and, across partitions, its
partition and the others' choices by :func:`tula.model.across.choose` (:class:`Across`);
everything after the choice reads it back with :meth:`Selection.read`. Each part is frozen;
the JSON keeps the keys and their order that results/README.md names (``to_json``,
``from_json``: a key the type does not know is an error that names it)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import pandas as pd

from tula.io import read_json

WAIT = "queue_wait_s"  # predictions.csv's column: the queue's expected wait at a point's N


def _names(cls) -> list[str]:
    return [f.name for f in fields(cls)]


def _known(what: str, d: dict[str, Any], known: list[str], required: list[str]) -> None:
    """ValueError naming the keys ``d`` lacks or the type does not know."""
    missing = [k for k in required if k not in d]
    if missing:
        raise ValueError(f"not {what} (missing {', '.join(missing)})")
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise ValueError(f"not {what}'s key(s): {', '.join(unknown)}")


def _flat(obj, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """A record's fields in order, those in ``optional`` left out where None."""
    return {
        f.name: getattr(obj, f.name)
        for f in fields(obj)
        if not (f.name in optional and getattr(obj, f.name) is None)
    }


@dataclass(frozen=True)
class Point:
    """One grid point as the choice names it: predictions.csv's row, in its units."""

    workers: int  # N
    nodes: int | None
    global_batch: int  # B
    local_batch: int  # B / (N k)
    step_time_s: float
    train_time_s: float  # T
    cost: float  # C, in ``currency``
    currency: str
    mem_bytes: float
    probed: bool  # a probe measured this point and it ran
    accumulate: int | None = None  # train.accumulate's k micro-batches a step; None: one
    queue_wait_s: float | None = None  # the queue's expected wait, where known
    partition: str | None = None  # across partitions: the partition it is on

    OPTIONAL = ("accumulate", "queue_wait_s", "partition")

    @property
    def key(self) -> tuple[int, int]:
        return self.workers, self.global_batch

    @property
    def micro_batches(self) -> int:
        return self.accumulate or 1

    @classmethod
    def of_row(cls, row: pd.Series, currency: str) -> Point:
        """A predictions.csv row (with ``queue_wait_s`` where the queue was asked)."""
        k = row.get("accumulate", 1)
        return cls(
            workers=int(row["workers"]),
            nodes=int(row["nodes"]) if "nodes" in row else None,
            global_batch=int(row["global_batch"]),
            local_batch=int(row["local_batch"]),
            step_time_s=float(row["step_time_s"]),
            train_time_s=float(row["train_time_s"]),
            cost=float(row["cost"]),
            currency=currency,
            mem_bytes=float(row["mem_bytes"]),
            probed=bool(row.get("probe_status", "") == "ok"),
            accumulate=int(k) if k > 1 else None,
            queue_wait_s=float(row[WAIT]) if WAIT in row and pd.notna(row[WAIT]) else None,
        )

    def on(self, partition: str) -> Point:
        return replace(self, partition=partition)

    def to_json(self) -> dict[str, Any]:
        return _flat(self, self.OPTIONAL)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Point:
        _known("a chosen point", d, _names(cls), ["workers", "global_batch"])
        return cls(**d)


@dataclass(frozen=True)
class Share:
    """A point and the share of resamples that chose it."""

    workers: int
    global_batch: int
    share: float

    @property
    def key(self) -> tuple[int, int]:
        return self.workers, self.global_batch

    def to_json(self) -> dict[str, Any]:
        return _flat(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Share:
        _known("a resampled share", d, _names(cls), _names(cls))
        return cls(**d)


@dataclass(frozen=True)
class Robustness:
    """How firmly the probes' noise holds the choice (:func:`tula.model.robust.verdict`)."""

    resamples: int
    method: str
    scatter_ratio: float  # the standard errors' inflation: the fit's scatter over them
    shares: tuple[Share, ...]  # every point some resample chose, most chosen first
    point_estimate: Share  # the measured means' choice
    chosen: Share  # the point chosen in most resamples
    runner_up: Share | None
    settled: bool  # ``chosen`` won more than ``threshold`` of the resamples
    threshold: float
    rule: str
    to_settle: str | None = None  # where not settled: what would settle it

    def to_json(self) -> dict[str, Any]:
        out = _flat(self, ("to_settle",))
        out["shares"] = [s.to_json() for s in self.shares]
        for k in ("point_estimate", "chosen", "runner_up"):
            out[k] = out[k] and out[k].to_json()
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Robustness:
        _known("robustness", d, _names(cls), ["resamples", "chosen", "settled"])
        share = Share.from_json
        return cls(
            **{
                **d,
                "shares": tuple(share(s) for s in d["shares"]),
                "point_estimate": share(d["point_estimate"]),
                "chosen": share(d["chosen"]),
                "runner_up": share(d["runner_up"]) if d.get("runner_up") else None,
            }
        )


@dataclass(frozen=True)
class Standing:
    """One partition's own choice and its value in the measure the partitions are compared
    by; the runner-up's with its ratio to the chosen one's."""

    partition: str
    value: float
    point: Point
    ratio: float | None = None  # the runner-up's value over the chosen one's

    def to_json(self) -> dict[str, Any]:
        out = {"partition": self.partition, "value": self.value, **self.point.to_json()}
        return out if self.ratio is None else {**out, "ratio": self.ratio}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Standing:
        rest = {k: v for k, v in d.items() if k not in ("partition", "value", "ratio")}
        return cls(d["partition"], d["value"], Point.from_json(rest), d.get("ratio"))


@dataclass(frozen=True)
class Across:
    """selection.json's ``across_partitions``: each partition's choice (:func:`choose`), what
    their probes say of each other's compute, which share a GPU, and their queues."""

    measure: str  # predictions.csv's column they are compared by
    what: str  # its words
    unit: str
    partitions: tuple[Standing, ...]  # best first
    chosen: str
    runner_up: Standing | None
    compute_ratios: tuple[dict[str, Any], ...] | None = None
    same_gpu: tuple[tuple[str, ...], ...] | None = None
    queues: dict[str, Any] | None = None  # each partition's queue.json

    @property
    def standing(self) -> dict[str, Standing]:
        return {s.partition: s for s in self.partitions}

    def to_json(self) -> dict[str, Any]:
        out = _flat(self, ("compute_ratios", "same_gpu", "queues"))
        out["partitions"] = [s.to_json() for s in self.partitions]
        out["runner_up"] = self.runner_up and self.runner_up.to_json()
        for k in ("compute_ratios", "same_gpu"):
            if k in out:
                out[k] = [list(g) if k == "same_gpu" else g for g in out[k]]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Across:
        _known("across_partitions", d, _names(cls), ["partitions", "chosen"])
        return cls(
            **{
                **d,
                "partitions": tuple(Standing.from_json(p) for p in d["partitions"]),
                "runner_up": Standing.from_json(d["runner_up"]) if d.get("runner_up") else None,
                "compute_ratios": None if "compute_ratios" not in d else tuple(d["compute_ratios"]),
                "same_gpu": None if "same_gpu" not in d else tuple(map(tuple, d["same_gpu"])),
            }
        )


@dataclass(frozen=True)
class Selection:
    """What the choice chose (:func:`tula.model.choice.select`), in selection.json's order."""

    objective: str
    candidates: int  # feasible points inside the constraints
    excluded: dict[str, int]  # points left out, by why
    selected: Point
    runner_up: Point | None
    reason: str
    pricing: dict[str, Any]  # the price model the cost was computed with
    knee: dict[str, Any] | None = None  # objective knee: both rules' answers
    noise: dict[str, Any] | None = None  # the to-accuracy objectives: the noise scale
    queue: dict[str, Any] | None = None  # tula queue's queue.json the waits came from
    robustness: Robustness | None = None
    partition: str | None = None  # across partitions: the chosen one
    across_partitions: Across | None = None

    OPTIONAL = ("knee", "noise", "queue", "robustness", "partition", "across_partitions")
    # the order selection.json has always had: the objective's block before the point
    ORDER = tuple(
        "objective candidates excluded knee noise selected runner_up reason pricing queue "
        "robustness partition across_partitions".split()
    )

    @property
    def point(self) -> tuple[int, int]:
        """(N, B) chosen."""
        return self.selected.key

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in self.ORDER:
            v = getattr(self, k)
            if v is None and k in self.OPTIONAL:
                continue
            out[k] = v.to_json() if hasattr(v, "to_json") else v
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Selection:
        _known("a selection", d, list(cls.ORDER), ["objective", "selected", "reason"])
        robust, across = d.get("robustness"), d.get("across_partitions")
        return cls(
            **{
                **d,
                "selected": Point.from_json(d["selected"]),
                "runner_up": Point.from_json(d["runner_up"]) if d.get("runner_up") else None,
                "robustness": Robustness.from_json(robust) if robust else None,
                "across_partitions": Across.from_json(across) if across else None,
            }
        )

    @classmethod
    def read(cls, path: str | Path) -> Selection:
        """selection.json read back; the error names the file."""
        try:
            return cls.from_json(read_json(path))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from None
