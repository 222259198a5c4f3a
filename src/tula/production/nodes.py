"""A node lost under the production job, on SLURM: wait for it, then re-plan onto what is left.

When a node of a running job dies (or an admin sets it down), SLURM ends the job NODE_FAIL and
requeues it (``JobRequeue``, the default for batch jobs): it waits PENDING for as many nodes as
its shape needs. If the node comes back, SLURM starts the job again and it resumes from its
last checkpoint at the same shape; nothing here is needed. If the partition no longer has
enough nodes that can start a job, the job would wait forever. :class:`NodeWatch` (called at
each poll of :func:`tula.production.submission.wait`) notices that, waits ``launch.node_wait_min``,
then cancels the waiting job and decides where the rest trains: the objective's choice among
the predictions at the worker counts the nodes left can run (:func:`tula.model.refit.onto`).
The launcher continues there from the checkpoint (every sample once per epoch: the position
is in samples, independent of N and B), and says why in its log, attempts.json and final.json.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from tula import model_inputs, preflight
from tula.config import Config
from tula.model import refit
from tula.model.choice import NoFeasibleConfiguration
from tula.slurm import accounting, controller, partition_info
from tula.workers.processes import LOST_PEER

WAITING = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "CONFIGURING")


LOST = ("replanned", "node_lost", "peer_lost")  # attempts a lost node (or peer) ended


class NodeWatch:
    """Whether the training job at N = ``workers`` waits for nodes the partition no longer has,
    for longer than ``launch.node_wait_min``; then :attr:`decision` is where to go on."""

    def __init__(self, cfg: Config, predictions: str | Path | None, partition: str | None):
        self.cfg, self.predictions, self.partition = cfg, predictions, partition
        self.start(0, 0, "local")

    def start(self, workers: int, batch: int, executor: str) -> None:
        """A new attempt at (``workers``, ``batch``): nothing seen yet."""
        self.workers, self.batch = workers, batch
        self.slurm = executor == "slurm"  # a local job has no nodes to lose
        self.short_since: float | None = None  # when the partition was first seen short
        self.last_look = 0.0
        self.decision: refit.Decision | None = None
        self.said = ""

    def runnable(self, part: partition_info.Partition) -> list[int]:
        """The predictions' worker counts (else the grid's) whose job the partition's nodes that
        can start one now can hold."""
        ns = (
            sorted(set(pd.read_csv(self.predictions)["workers"].astype(int)))
            if self.predictions and Path(self.predictions).exists()
            else sorted(self.cfg.grid.workers)
        )
        need = {n: preflight.job_needs(self.cfg, None, n)[-1] for n in ns}
        return [n for n in ns if not preflight.problems(self.cfg, part, need[n])]

    def say(self, text: str) -> None:
        if text != self.said:
            print(f"[launch] {text}", flush=True)
            self.said = text

    def check(self, job_id: str) -> bool:
        """Called at each poll; True once the waiting job was cancelled to re-plan."""
        now = time.monotonic()
        if self.decision is not None or now - self.last_look < max(self.cfg.launch.poll_s, 5):
            return self.decision is not None
        self.last_look = now
        if accounting.job_state(job_id).split(" ")[0] not in WAITING:
            self.short_since = None
            return False
        try:
            part = partition_info.read_partition(self.partition)
        except (controller.ClusterUnreadable, partition_info.PreflightError):
            return False
        ok = self.runnable(part)
        if self.workers in ok:
            self.short_since = None  # waiting for free nodes, not for lost ones
            return False
        self.short_since = self.short_since or now
        wait_s = 60 * self.cfg.launch.node_wait_min
        lost = "; ".join(part.unusable()) or "not enough nodes"
        if now - self.short_since < wait_s:
            self.say(
                f"job {job_id} waits for the nodes of N={self.workers}, but partition "
                f"'{part.name}' cannot give them now ({lost}); waiting up to "
                f"launch.node_wait_min={self.cfg.launch.node_wait_min:g} min for them to come "
                "back, then re-planning onto the nodes left"
            )
            return False
        if not ok or not self.predictions or not Path(self.predictions).exists():
            why = "no grid N can run on them" if not ok else "no predictions.csv to re-plan from"
            self.say(
                f"job {job_id} still waits for the nodes of partition '{part.name}' ({lost}): {why}"
            )
            return False
        try:
            dec = refit.onto(
                model_inputs.planning(self.cfg),
                pd.read_csv(self.predictions),
                self.workers,
                self.batch,
                ok,
            )
        except NoFeasibleConfiguration as exc:
            self.say(f"job {job_id} still waits: nothing to re-plan onto on the nodes left ({exc})")
            return False
        waited = now - self.short_since
        self.decision = refit.Decision(
            True,
            dec.workers,
            dec.global_batch,
            f"partition '{part.name}' lost nodes ({lost}) and none came back within "
            f"launch.node_wait_min={self.cfg.launch.node_wait_min:g} min (waited {waited:.0f} s): "
            + dec.reason,
            0.0,
        )
        subprocess.run(["scancel", job_id], check=False)
        self.say(self.decision.reason + f"; cancelled the waiting job {job_id}")
        return True

    def around(self, att, executor: str, drift_check, job) -> Callable[[], bool] | None:
        """The check :func:`tula.production.submission.wait` calls at each poll of the attempt
        ``att``: the drift watch's (``drift_check``, or None) and, on SLURM, this one."""
        self.start(att.global_batch // att.local_batch, att.global_batch, executor)
        if not self.slurm:
            return drift_check

        def check() -> bool:
            moved = drift_check() if drift_check is not None else False
            return self.check(str(job.job_id)) or moved

        return check

    def outcome(self, ended: tuple[str, str], job) -> tuple[str, str]:
        """How the attempt ended, given what :func:`tula.production.submission.outcome` read: a
        re-plan cancelled it; a node failure ended it (a node of the job is down now, or SLURM
        says NODE_FAIL) without SLURM requeueing it; or its workers lost their peers
        (:data:`LOST_PEER`) before the controller marked any node down (it notices a dead
        node only after ``SlurmdTimeout``, 300 s by default): all three go on."""
        if self.decision is not None:
            return "replanned", self.decision.reason
        if ended[0] != "failed" or not self.slurm:
            return ended
        job_id = str(job.job_id)
        lost = self.lost_nodes(job_id)
        if lost or accounting.job_state(job_id).startswith("NODE_FAIL"):
            return (
                "node_lost",
                f"job {job_id} ended when its node(s) failed ({'; '.join(lost) or 'NODE_FAIL'}: "
                f"{ended[1]}); resubmitted at the same shape, from the last checkpoint",
            )
        if LOST_PEER.search(ended[1]):
            return (
                "peer_lost",
                f"job {job_id} failed when its workers lost a peer ({ended[1]}), though no node "
                "of it is down (yet): resubmitted at the same shape, from the last checkpoint",
            )
        return ended

    def lost_nodes(self, job_id: str) -> list[str]:
        """The job's nodes that cannot start a job now, each with its state and reason."""
        try:
            part = partition_info.read_partition(self.partition)
        except (controller.ClusterUnreadable, partition_info.PreflightError):
            return []
        mine = set(accounting.job_nodes(job_id))
        return [u for u, name in zip(part.unusable(), part.unusable_names()) if name in mine]

    def resubmits(self, attempts: list) -> bool:
        """Whether the last attempt ended on a lost node or peer and is to be resubmitted at
        its shape: at most launch.max_requeues times in a row."""
        lost = 0
        for a in reversed(attempts):
            if a.outcome not in ("node_lost", "peer_lost"):
                break
            lost += 1
        return 0 < lost <= self.cfg.launch.max_requeues


def events(attempts: list) -> list[dict[str, Any]]:
    """final.json's ``nodes_lost``: each attempt a lost node ended, with what followed."""
    return [
        {
            "attempt": a.attempt,
            "workers": a.workers,
            "global_batch": a.global_batch,
            "checkpoint_step": a.checkpoint_step,
            "outcome": a.outcome,
            "reason": a.reason,
        }
        for a in attempts
        if a.outcome in LOST
    ]
