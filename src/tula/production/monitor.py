"""The production job keeps measuring: now and then a paired compute-only step.

At a monitored step every rank runs the training step twice on the same batch: first under
``DDP.no_sync()`` (the probe's compute-only step, the same :meth:`Replica.step`), after which
everything that step changed is put back exactly (model, optimizer, schedule, scaler,
position, epoch sums, RNG), then the real synced step. Training is bit-for-bit what it would
have been without monitoring (``tests/runtime/test_monitor.py``). The pair's times, the
slowest rank's each (one all-reduce), give compute and sync apart while the job trains; rank
0 appends them to ``steps.csv`` and feeds the drift detector (:mod:`tula.model.drift`).

How often: ``launch.monitor_every_steps``. ``auto`` keeps the measured cost of monitoring
(the extra compute-only step, the snapshot and its restore) at or below 1 % of the training
steps, all of it counted: a pair costs about one step (19 ms against a 17 ms step, digits on
2 workers), so the first comes 100 steps in, and each next one where what the pairs cost so
far plus one more like the last is 1 % of the steps trained (:func:`next_auto_pair`),
computed from the agreed times so every rank takes the same steps. (Scheduled from each
pair's own cost alone, the first pair was not paid for: BENCHMARKS.md "Nodes and networks".)
Post-local SGD has no per-step all-reduce to time and is not monitored.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import torch
import torch.distributed as torch_dist

from tula.io import read_json, write_csv, write_json
from tula.model import drift as drift_mod
from tula.production.ledger import Ledger
from tula.runtime.group import agreement
from tula.runtime.step.replica import Replica

COST_SHARE = 0.01  # auto: monitoring costs at most this share of the training steps
# auto: the first pair (about one step's cost) after this many steps: 1 % from the start
FIRST_AFTER = 100
COLUMNS = [
    "step",
    "epoch",
    "workers",
    "global_batch",
    "step_time_s",
    "compute_time_s",
    "sync_time_s",
    "monitor_cost_s",
    "predicted_sync_s",
    "sync_lo_s",
    "sync_hi_s",
    "attempt",
    "time",
]


def next_auto_pair(at: int, since: int, spent_s: float, cost_s: float, step_s: float) -> int:
    """``auto``: the step of the next pair after the one at step ``at``: the first at which the
    pairs paid since step ``since`` (``spent_s``) plus one more costing ``cost_s`` stay within
    COST_SHARE of the steps trained since then at ``step_s`` each."""
    return max(at + 1, since + math.ceil((spent_s + cost_s) / (COST_SHARE * max(step_s, 1e-9))))


class Monitor:
    """When to monitor, the paired step, and (rank 0) steps.csv, drift.json and the detector.

    Across a requeue or a relaunch the rows and drifts of steps up to the checkpoint resumed
    from are kept (later steps are trained again, and measured again)."""

    def __init__(
        self,
        replica: Replica,
        every: int | str | None,
        ledger: Ledger,
        band: drift_mod.Band | None,
        replan: str,
    ):
        self.replica, self.ledger, self.band = replica, ledger, band
        self.replan = replan  # launch.replan: a drift found is recorded, or also reported to move
        self.out, self.attempt, resumed_from = Path(ledger.out), ledger.attempt, ledger.resumed_from
        # why no pair is due in this run (None: pairs are due, the first at first_due)
        self.off = (
            "launch.replan: off"
            if replan == "off"
            else "launch.monitor_every_steps: null"
            if every is None
            else "post-local SGD has no per-step all-reduce to time"
            if replica.cadence.method == "polo"
            else "one worker has no sync to time"
            if replica.world == 1
            else None
        )
        self.enabled = self.off is None
        self.setting = every  # launch.monitor_every_steps, as it ran (None: off)
        self.every = None if every in (None, "auto") else int(every)
        # auto's budget: the steps since (re)start and what their pairs cost (times carries earlier
        # attempts' too)
        self.since, self.spent_before = resumed_from, ledger.times["monitor_time_s"]
        self.next_step = resumed_from + (self.every or FIRST_AFTER)
        self.first_due = self.next_step if self.enabled else None
        self.detector = drift_mod.Detector(band) if band is not None and replica.rank == 0 else None
        self.rows, self.drifts = [], []
        if replica.rank == 0:
            steps, drifts = self.out / "steps.csv", self.out / "drift.json"
            if steps.exists() and resumed_from > 0:
                self.rows = [
                    r for r in pd.read_csv(steps).to_dict("records") if r["step"] <= resumed_from
                ]
            if drifts.exists() and resumed_from > 0:
                self.drifts = [d for d in read_json(drifts) if d["step"] <= resumed_from]
            write_csv(steps, pd.DataFrame(self.rows, columns=COLUMNS))
            write_json(drifts, self.drifts)

    def summary(self) -> dict[str, Any]:
        """For final.json (rank 0): how much was monitored, what it cost, the drifts found."""
        return {
            "monitored_steps": len(self.rows),
            "monitor_every_steps": self.setting,
            "monitor_off": self.off,
            "monitor_first_due_step": self.first_due,
            "drift": self.drifts,
            "drift_band_s": asdict(self.band) if self.band else None,
        }

    def due(self) -> bool:
        r = self.replica
        # a plain step: not an epoch's first (loader refill, AGS refresh) nor an AGS refresh
        return (
            self.enabled
            and r.steps_done >= self.next_step
            and r.epoch_offset > 0
            and not r.refreshes_next
        )

    def paired_step(self, batches: Iterator) -> tuple[float, int] | None:
        """Fetch the next batch; a compute-only step on it (then undone), then the real step.
        Returns (seconds of the real step, fetch included; its stop code) or None at the
        epoch's end."""
        r, timer = self.replica, self.ledger.timer  # the probe's timer: as the probe times
        # the fetch, timed as the timer times (queued steps drained first on a host clock)
        fetch, batch = timer.time_call(lambda: next(batches, None))
        if batch is None:
            return None
        t1 = time.perf_counter()

        def compute_only(_: int) -> tuple[int, str]:
            with r.no_sync():
                r.step(*batch)
            return 1, "plain"

        with r.undone():  # the compute-only step, then everything it changed put back
            compute = fetch + timer.time_once(compute_only)[0]
        r.sync_device()
        overhead = time.perf_counter() - t1  # what the pair adds: snapshot, compute-only, restore
        stop = [0]

        def synced(_: int) -> tuple[int, str]:
            stop[0] = r.step(*batch)
            return 1, "plain"

        step = fetch + timer.time_once(synced)[0]
        agreed = torch.tensor([step, compute, overhead], dtype=torch.float64)
        # the slowest rank's, as the probe takes it; over the CPU group (a CPU tensor, NCCL or not)
        torch_dist.all_reduce(agreed, op=torch_dist.ReduceOp.MAX, group=agreement.HOST_GROUP[0])
        step, compute, overhead = agreed.tolist()
        self.ledger.spend("monitor_time_s", overhead)
        self._schedule(step, overhead)
        if r.rank == 0:
            self._record(step, compute, overhead)
        return step, stop[0]

    def _schedule(self, step_s: float, cost_s: float) -> None:
        at = self.replica.steps_done - 1  # the pair's step index (steps_done counts it done)
        if self.every:
            self.next_step = at + self.every
        else:
            # the pairs since (re)start, this one included
            spent = self.ledger.times["monitor_time_s"] - self.spent_before
            self.next_step = next_auto_pair(at, self.since, spent, cost_s, step_s)

    def _record(self, step_s: float, compute_s: float, cost_s: float) -> None:
        r, b = self.replica, self.band
        sync = max(step_s - compute_s, 0.0)
        self.rows.append(
            {
                "step": r.steps_done,
                "epoch": r.epoch,
                "workers": r.world,
                "global_batch": r.global_batch,
                "step_time_s": step_s,
                "compute_time_s": compute_s,
                "sync_time_s": sync,
                "monitor_cost_s": cost_s,
                "predicted_sync_s": b.predicted_s if b else math.nan,
                "sync_lo_s": b.accept_lo_s if b else math.nan,
                "sync_hi_s": b.accept_hi_s if b else math.nan,
                "attempt": self.attempt,
                "time": time.time(),
            }
        )
        write_csv(self.out / "steps.csv", pd.DataFrame(self.rows, columns=COLUMNS))
        if self.detector is None:
            return
        found = self.detector.observe(r.steps_done, sync)
        if found is not None:
            move = self.replan == "move"
            self.drifts.append(
                {
                    **found.to_dict(),
                    "workers": r.world,
                    "global_batch": r.global_batch,
                    "attempt": self.attempt,
                    "time": time.time(),
                    "epochs_done": r.epochs_done,
                    "action": "reported to tula launch" if move else "recorded",
                }
            )
            write_json(self.out / "drift.json", self.drifts)
            print(
                f"[train N={r.world} B={r.global_batch}] drift: {found.describe()}; "
                f"{self.drifts[-1]['action']} (launch.replan: {self.replan})",
                flush=True,
            )
