"""Stopping the production job between two steps: SLURM's signals (USR2 before the time
limit or on preemption: checkpoint, then submitit requeues; TERM from scancel: checkpoint,
then exit) and `tula launch`'s request to stop for a move (launch.replan: move)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

from tula.production import jobdir
from tula.production.ledger import Ledger
from tula.runtime.group import dist


class StopSignals:
    """SIGTERM / SIGUSR2 set a flag; the training loop acts on it at the next step boundary
    once every rank agrees, so a checkpoint is never taken in the middle of a step.

    USR2 is what SLURM sends before the time limit or on preemption (``--signal=USR2@...``,
    set by submitit); after the checkpoint submitit's own handler requeues the job. TERM is
    scancel, ``scontrol requeue`` or a preemption without grace: checkpoint, then exit.
    """

    CODES = {
        signal.SIGTERM: 1,
        signal.SIGINT: 1,
        signal.SIGUSR2: 2,
    }  # SIGINT: Ctrl-C on a local run

    def __init__(self) -> None:
        self.code, self.name, self.reason, self.looked = 0, "", "", 0.0
        self.previous = {sig: signal.getsignal(sig) for sig in self.CODES}
        for sig in self.CODES:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        sig = signal.Signals(signum)
        if self.CODES[sig] >= self.code:
            self.code, self.name = self.CODES[sig], sig.name

    def move_requested(self, path: Path) -> int:
        """Rank 0: has `tula launch` asked the job to stop for a move (launch.replan: move)? The
        request is a file beside the results (shared with the login node); looked for at most
        once a second. The ranks agree on the answer with the step's flags, as on a signal."""
        now = time.monotonic()
        if self.code == 0 and now - self.looked >= 1.0:
            self.looked = now
            if path.exists():
                self.code, self.reason = (
                    1,
                    f"tula launch asked for a move ({path.read_text().strip()})",
                )
        return self.code

    def requeue_handler(self):
        """submitit's checkpoint-and-requeue handler, when running under submitit."""
        h = self.previous[signal.SIGUSR2]
        return (
            h
            if callable(h) and type(getattr(h, "__self__", None)).__name__ == "SignalHandler"
            else None
        )


def stop(
    code: int,
    stops: StopSignals,
    ledger: Ledger,
    step: int,
    requeue_otherwise: Callable[[int, Any], None] | None = None,
) -> None:
    """After the stop checkpoint: record the segment, leave the process group, and either let
    submitit requeue the job (USR2 under submitit; ``requeue_otherwise`` where submitit is not
    there, the plan's batch script's own requeue) or exit (TERM). Never returns."""
    sig = (
        stops.name.removeprefix("SIG")
        if stops.name and stops.CODES[signal.Signals[stops.name]] == code
        else ("USR2" if code == 2 else "TERM")
    )  # this rank's own signal, else the one the peers agreed on
    requeue = (stops.requeue_handler() or requeue_otherwise) if code == 2 else None
    if ledger.rank == 0:
        who = "submitit" if requeue is not None and requeue is not requeue_otherwise else "SLURM"
        what = f"checkpointed; {who} requeues the job" if requeue else "checkpointed; exiting"
        why = stops.reason or f"SIG{sig} (preemption, time limit or cancel)"
        said = stops.reason or f"SIG{sig} received"
        print(f"[{ledger.label}] {said}: stopped after step {step}, {what}", flush=True)
        jobdir.add_segment(
            ledger.out,
            ledger.segment(
                end_step=step,
                outcome="requeued" if requeue else "stopped",
                ended=jobdir.utc_now(),
                reason=f"{why}: {what}",
            ),
        )
    dist.shutdown(ok=True)
    sys.stdout.flush()
    if requeue is not None:
        # rank 0: scontrol requeue (or the local executor's requeue) and exit
        requeue(signal.SIGUSR2, None)
    raise SystemExit(0 if requeue is not None else 128 + signal.SIGTERM)
