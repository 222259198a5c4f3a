"""What every role's driver shares (:class:`Plain`: the script's own run, every call a
pass-through), the step under way (:class:`Stepping`) and what a driver reads of the run
(:class:`Loop`)."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Protocol

import torch

from tula.io import write_json
from tula.runtime.train.optim_state import state_tensors
from tula.script.parts import Parts
from tula.script.walk import Walk
from tula.workers.processes import result_path
from tula.workers.script_run import ScriptRun


@dataclass
class Stepping:
    """One step under way: its kind, and what the step function returned (its loss)."""

    kind: str
    value: Any = None

    def returned(self, value: Any) -> Any:
        """What the step function returned."""
        self.value = value
        return value


class Loop(Protocol):
    """What a role's driver reads of the script's run (:class:`tula.script.run.Run`)."""

    spec: ScriptRun | None
    rank: int
    world: int
    local_batch: int
    global_batch: int
    num_epochs: int | None
    parts: Parts
    walk: Walk


class Plain:
    """The script's own run, without Tula: every call passes through."""

    def __init__(self, run: Loop):
        # the run's parts and walk, handed to the driver as it is built (it changes them only
        # through their methods)
        self.run, self.parts, self.walk = run, run.parts, run.walk

    def kept(self) -> None:
        pass

    @contextlib.contextmanager
    def step(self, now: Stepping) -> Iterator[None]:
        yield

    def stepped(self, now: Stepping) -> None:
        pass

    def epoch_starts(self) -> None:
        pass

    def epoch_ends(self) -> None:
        pass

    def epoch_end(self, row: dict[str, float | None]) -> None:
        pass

    def finish(self) -> Any:
        return None

    def sync(self) -> None:
        """Wait for the device (a timed stretch ends)."""
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def end(self, record: dict[str, Any], code: int = 0) -> None:
        """Write this rank's result where the launcher reads it, then end the process: its
        measurement is made, the rest of the script is not needed."""
        spec = self.run.spec
        assert spec is not None and spec.result_dir is not None
        write_json(result_path(spec.result_dir, self.run.rank), record)
        sys.stdout.flush()
        raise SystemExit(code)


def param_bytes(run: Loop) -> dict[str, int | None]:
    """Eq. 3's static terms, counted from the parts handed (None where none was)."""
    parts = run.parts
    module, opt = parts.module, parts.optimizer
    if module is None:
        return {"param_bytes": None, "grad_bytes": None, "opt_bytes": None}
    params = list(module.parameters())
    return {
        "param_bytes": sum(p.numel() * p.element_size() for p in params),
        "grad_bytes": sum(
            p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None
        ),
        "opt_bytes": sum(t.numel() * t.element_size() for t in state_tensors(opt))
        if opt is not None
        else None,
    }
