"""The parts a user's script hands Tula to checkpoint (``run.keep(model=..., optimizer=...)``):
anything with ``state_dict``/``load_state_dict`` (a model, an optimizer, an LR scheduler, a
GradScaler, an EMA, the script's own counters). A model wrapped in DDP (or compiled) is saved
as the module inside, so that a checkpoint loads at another N; the DDP wrapper is what a
probe's compute-only step runs under (its ``no_sync()``)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def inner(part: Any) -> Any:
    """The object whose state is saved: DDP's module, a compiled module's original."""
    while True:
        if isinstance(part, DDP):
            part = part.module
        elif hasattr(part, "_orig_mod") and isinstance(part, torch.nn.Module):
            part = part._orig_mod
        else:
            return part


class Parts:
    """The script's parts by name, in the order handed."""

    def __init__(self) -> None:
        self.by_name: dict[str, Any] = {}
        self.watched: dict[str, Any] = {}  # measured, not saved (run.watch)

    def add(self, parts: dict[str, Any], saved: bool = True) -> None:
        """Keep ``parts``; each must have ``state_dict`` and ``load_state_dict``. ``saved``
        False: only watched (its state is in a saved part already)."""
        for name, part in parts.items():
            if not saved:
                self.watched[name] = part
                continue
            obj = inner(part)
            missing = [m for m in ("state_dict", "load_state_dict") if not hasattr(obj, m)]
            if missing:
                raise TypeError(
                    f"tula.script: run.keep({name}=...) got a {type(part).__name__}, which has "
                    f"no {' or '.join(missing)}: Tula checkpoints what it can save and load"
                )
            self.by_name[name] = part

    def __bool__(self) -> bool:
        return bool(self.by_name)

    def of_type(self, kind: type) -> Any:
        """The first part (as handed) that is, or wraps, a ``kind``."""
        for part in (*self.watched.values(), *self.by_name.values()):
            if isinstance(part, kind) or isinstance(inner(part), kind):
                return part
        return None

    @property
    def ddp(self) -> DDP | None:
        """The DDP model handed, if any."""
        for part in (*self.watched.values(), *self.by_name.values()):
            while hasattr(part, "_orig_mod") and not isinstance(part, DDP):
                part = part._orig_mod
            if isinstance(part, DDP):
                return part
        return None

    @property
    def module(self) -> torch.nn.Module | None:
        """The model (inside DDP), for its parameters' bytes and device."""
        part = self.of_type(torch.nn.Module)
        return inner(part) if part is not None else None

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        return self.of_type(torch.optim.Optimizer)

    def no_sync(self) -> contextlib.AbstractContextManager:
        """A compute-only step: the gradient all-reduce left out (DDP's no_sync; nothing to
        leave out without DDP)."""
        ddp = self.ddp
        return ddp.no_sync() if ddp is not None else contextlib.nullcontext()

    def device(self) -> torch.device:
        """Where the model's parameters are (the CPU without a model)."""
        module = self.module
        for p in module.parameters() if module is not None else []:
            return p.device
        return torch.device("cpu")

    def state_dict(self) -> dict[str, Any]:
        return {name: inner(part).state_dict() for name, part in self.by_name.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Each part put back from its own state; a part the checkpoint lacks is named."""
        missing = [n for n in self.by_name if n not in state]
        if missing:
            raise KeyError(
                f"tula.script: the checkpoint has no part named {missing} (it holds "
                f"{sorted(state)}): run.keep() must name the parts as the run that wrote it did"
            )
        for name, part in self.by_name.items():
            inner(part).load_state_dict(state[name])

    def describe(self) -> dict[str, str]:
        """Each part's name and type (the check's record)."""
        return {name: type(part).__name__ for name, part in self.by_name.items()}
