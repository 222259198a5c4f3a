"""``launch.replan: move`` on the launcher's side: read the drifts the running job reports,
wait until the next observations say whether each held (:func:`tula.model.drift.held`),
decide on those that did (:func:`tula.model.refit.decide`), and ask the job to checkpoint and
stop when moving pays; what it decided goes into the attempt's record."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd

from tula import model_inputs
from tula.config import Config
from tula.io import read_json, write_bytes
from tula.model import drift as drift_mod
from tula.model import refit
from tula.production import jobdir
from tula.production.attempts import Attempt


class Replan:
    """The decisions of one `tula launch` on its job's drifts."""

    def __init__(self, cfg: Config, predictions: str | Path | None, out: Path):
        self.cfg, self.predictions, self.out = cfg, predictions, out
        self.move: refit.Decision | None = None  # the move decided on for the current attempt
        self.decisions: dict[int, dict[str, str]] = {}  # drift step -> what was decided

    def watch(self, att: Attempt, workers: int) -> Callable[[], bool] | None:
        """A check for :func:`submission.wait` while ``att`` trains at N = ``workers``: on each
        new drift the job reports, decide (:func:`refit.decide`); on a move, ask the job to
        checkpoint and stop (a request file rank 0 looks for), and say so. The check returns
        True once a move is asked for. None where nothing is re-planned (launch.replan is not
        move, or there are no predictions)."""
        self.move, self.decisions = None, {}
        if self.cfg.launch.replan != "move" or not self.predictions:
            return None

        def check() -> bool:
            if self.move is not None:
                return False
            drifts = [
                d for d in jobdir.drifts(self.out, att.attempt) if d["step"] not in self.decisions
            ]
            steps = Path(self.out) / "steps.csv"  # read once a poll, only when a drift waits
            rows = pd.read_csv(steps) if drifts and steps.exists() else pd.DataFrame()
            for d in drifts:
                after = self.after(d, att.attempt, rows)
                if after is None:  # not yet observed long enough to say whether it held
                    continue
                if not after[0]:
                    self.decisions[d["step"]] = {
                        "action": "stayed",
                        "reason": f"{d['reason']}; {after[1]}; stayed",
                    }
                    print(f"[launch] drift at step {d['step']}: {after[1]}; stayed", flush=True)
                    continue
                dec = refit.decide(
                    model_inputs.planning(self.cfg),
                    pd.read_csv(self.predictions),
                    workers,
                    att.global_batch,
                    {**d, "reason": f"{d['reason']}; {after[1]}"},
                    self.relaunch_s(att),
                )
                self.decisions[d["step"]] = {
                    "action": "moved" if dec.move else "stayed",
                    "reason": dec.reason,
                }
                print(f"[launch] drift at step {d['step']}: {dec.reason}", flush=True)
                if dec.move:
                    self.move = dec
                    write_bytes(
                        jobdir.move_request_path(self.out),
                        f"to N={dec.workers} B={dec.global_batch}".encode(),
                    )
                    return True
            return False

        return check

    def decided(self, d: dict) -> dict:
        """Drift ``d`` (a drift.json entry) with what was decided on it; one the attempt ended
        before it could be confirmed says so."""
        if d["step"] in self.decisions:
            return {**d, **self.decisions[d["step"]]}
        if self.cfg.launch.replan == "move" and self.predictions:
            return {**d, "action": "not decided: the attempt ended before it could be confirmed"}
        return d

    @staticmethod
    def after(d: dict, attempt: int, rows: pd.DataFrame) -> tuple[bool, str] | None:
        """Whether drift ``d`` held over the next ``drift.CONFIRM`` observations of its attempt
        (``rows``: steps.csv), beyond the band it left (the predicted one of steps.csv, where
        the drift does not say), and in words; None until there are that many."""
        if rows.empty:
            return None
        rows = rows[(rows["attempt"] == attempt) & (rows["step"] > d["step"])].head(
            drift_mod.CONFIRM
        )
        if len(rows) < drift_mod.CONFIRM:
            return None
        lo, hi = float(rows["sync_lo_s"].iloc[0]), float(rows["sync_hi_s"].iloc[0])
        if d.get("accept_lo_s") is not None and d.get("accept_hi_s") is not None:
            lo, hi = float(d["accept_lo_s"]), float(d["accept_hi_s"])
        ok, med = drift_mod.held(d["direction"], rows["sync_time_s"].tolist(), lo, hi)
        span = f"the next {len(rows)} observations' median {1e3 * med:.1f} ms (steps "
        span += f"{int(rows['step'].iloc[0])}-{int(rows['step'].iloc[-1])})"
        if ok:
            return True, f"held: {span}"
        return (
            False,
            f"did not hold: {span}, not beyond the band ({1e3 * lo:.1f}-{1e3 * hi:.1f} ms)",
        )

    def relaunch_s(self, att: Attempt) -> float:
        """What a relaunch costs: this attempt's submission to its first step (started.json;
        after a requeue inside the attempt, its process start to first step: no queue wait seen)."""
        started = jobdir.started_path(self.out)
        if att.submitted and started.exists():
            s = read_json(started)
            if s.get("attempt") == att.attempt:
                since = (
                    att.submitted
                    if s.get("step") == att.start_step
                    else s.get("process_started", att.submitted)
                )
                return max(float(s["first_step_time"]) - float(since), 0.0)
        return 0.0
