"""The choice across partitions (``cluster.partitions``): pure on each partition's own
predictions and selection.

Each partition is planned on its own (its probes, its fits, its predictions, its choice under
the objective, how firmly its probes hold that choice). Across them the objective's own measure
decides: T for ``time`` (and ``knee`` on time), C for ``cost`` (and ``knee`` on cost), time or
cost to accuracy for those objectives, and the queue's expected wait plus T for
``time_to_result``. The knee is a property of one partition's curve, so ``knee`` compares the
partitions' knees by their T (or C). The runner-up is the best of the other partitions, with
its ratio to the chosen one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from tula.model.choice import TO_ACCURACY
from tula.model.selection import WAIT, Across, Point, Selection, Standing

PARTITION = "partition"


def measure(objective: str, knee_on: str) -> tuple[str, str]:
    """The column of predictions.csv the partitions are compared by, and its words."""
    if objective in TO_ACCURACY:
        col, what, _, _ = TO_ACCURACY[objective]
        return col, what
    if objective == "cost" or (objective == "knee" and knee_on == "cost"):
        return "cost", "cost C"
    if objective == "time_to_result":
        return "time_to_result_s", "queue wait + training time"
    return "train_time_s", "training time T"


def _row(pred: pd.DataFrame, point: Point) -> pd.Series:
    at = (pred["workers"] == point.workers) & (pred["global_batch"] == point.global_batch)
    if not at.any():
        raise ValueError(
            f"the selection's N={point.workers} B={point.global_batch} is not in its "
            "partition's predictions"
        )
    return pred[at].iloc[0]


def value(row: pd.Series, col: str) -> float:
    if col == "time_to_result_s":
        wait = row.get(WAIT)
        return float(row["train_time_s"]) + (0.0 if wait is None or pd.isna(wait) else wait)
    return float(row[col])


def combine(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every partition's predictions in one frame, with its name in column ``partition``."""
    return pd.concat(
        [f.assign(**{PARTITION: name}) for name, f in frames.items()], ignore_index=True
    )


def _line(s: Standing, col: str, unit: str) -> str:
    p, wait = s.point, s.point.queue_wait_s
    waited = f" (queue wait {wait:.0f} s)" if col == "time_to_result_s" and wait is not None else ""
    return f"{s.partition} N={p.workers} B={p.global_batch}: {s.value:.4g} {unit}{waited}"


def choose(
    frames: dict[str, pd.DataFrame],
    selections: dict[str, Selection],
    objective: str,
    knee_on: str,
    currency: str,
) -> Selection:
    """selection.json across partitions: the chosen partition's own selection, with its
    ``partition`` (in ``selected`` too) and an ``across_partitions`` block (each partition's
    choice and its value, the runner-up on another partition and its ratio)."""
    col, what = measure(objective, knee_on)
    unit = "s" if col.endswith("_s") else currency
    rows = [
        Standing(name, value(_row(frames[name], sel.selected), col), sel.selected)
        for name, sel in selections.items()
    ]
    rows.sort(key=lambda r: r.value)  # stable: equal values keep the order listed
    best, runner = rows[0], rows[1] if len(rows) > 1 else None
    reason = f"across {len(rows)} partitions by {what}: " + _line(best, col, unit)
    if runner is not None:
        ratio = runner.value / best.value if best.value > 0 else float("inf")
        reason += f"; runner-up {_line(runner, col, unit)}, {ratio:.2f}x"
        runner = replace(runner, ratio=runner.value / best.value if best.value else None)
    own = selections[best.partition]
    return replace(
        own,
        selected=own.selected.on(best.partition),
        partition=best.partition,
        reason=f"{reason}. Within {best.partition}: {own.reason}",
        across_partitions=Across(col, what, unit, tuple(rows), best.partition, runner),
    )


def compute_ratios(measured: dict[str, pd.DataFrame]) -> list[dict[str, Any]]:
    """For each partition after the first, the median of its probes' compute step over the
    first partition's at the same (N, B): what the probes say one partition's compute costs
    against the other's (the same GPU should give about 1)."""
    names = list(measured)
    out = []
    if not names:
        return out
    key = ["workers", "global_batch"]

    def ok(df: pd.DataFrame) -> pd.DataFrame:
        df = df[(df.get("source", "probe") == "probe") & (df["status"] == "ok")]
        return df.groupby(key)["compute_time_s"].median()

    ref = ok(measured[names[0]])
    for other in names[1:]:
        joined = pd.concat([ref, ok(measured[other])], axis=1, keys=["ref", "other"]).dropna()
        ratios = (joined["other"] / joined["ref"]).to_numpy()
        out.append(
            {
                PARTITION: other,
                "versus": names[0],
                "points": int(len(ratios)),
                "compute_ratio": float(np.median(ratios)) if len(ratios) else None,
            }
        )
    return out


def same_gpu(gpus: dict[str, Any]) -> list[list[str]]:
    """Groups of partitions with the same GPU (a name or the same figures): their compute fits
    should agree, and what differs between them is the network and the nodes."""
    groups: dict[str, list[str]] = {}
    for name, gpu in gpus.items():
        if gpu is not None:
            groups.setdefault(repr(gpu).lower(), []).append(name)
    return [g for g in groups.values() if len(g) > 1]


def with_waits(pred: pd.DataFrame, waits: dict[int, float]) -> pd.DataFrame:
    """``pred`` with each point's expected queue wait (by N; NaN where none is known)."""
    return pred.assign(**{WAIT: pred["workers"].map(waits).astype(float)})


def waits_by_workers(queue: dict[str, Any]) -> dict[int, float]:
    """queue.json's waits (``tula queue``), by N; {} where none was known."""
    return {int(w["workers"]): float(w["wait_s"]) for w in queue.get("waits", [])}


def after_wait(block: Across, waits: dict[str, float]) -> dict[str, Any]:
    """The choice across partitions again at submission, with the queue's waits asked now
    (``waits``: by partition, the chosen one's and the runner-up's): each one's wait plus its
    T, and whether the runner-up now finishes first. Only for a measure in seconds (a wait
    adds nothing to a cost)."""
    chosen, runner = block.standing[block.chosen], block.runner_up
    out: dict[str, Any] = {"waits_s": waits, "runner_first": False}
    if runner is None or block.unit != "s":
        return {**out, "reason": "no runner-up on another partition to compare with in time"}
    name, other = chosen.partition, runner.partition
    done = {
        name: waits.get(name, 0.0) + chosen.point.train_time_s,
        other: waits.get(other, 0.0) + runner.point.train_time_s,
    }
    planned = chosen.value, runner.value
    out.update(finish_s=done, runner_first=done[other] < done[name])
    if out["runner_first"]:
        out["reason"] = (
            f"the queue's wait on {name} is now {waits.get(name, 0.0):.0f} s: its job would end "
            f"{done[name]:.0f} s from now, and {other}'s (N={runner.point.workers} "
            f"B={runner.point.global_batch}, wait {waits.get(other, 0.0):.0f} s) "
            f"{done[other]:.0f} s from now, {done[name] - done[other]:.0f} s sooner; at the "
            f"plan {name} was ahead by {planned[1] - planned[0]:.0f} s"
        )
    else:
        out["reason"] = (
            f"{name} still ends first: {done[name]:.0f} s from now (wait "
            f"{waits.get(name, 0.0):.0f} s) against {other}'s {done[other]:.0f} s"
        )
    return out
