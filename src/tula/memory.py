"""Memory model, Eq. 3: M_total = M_param + M_grad + M_opt + M_act(b) + M_batch(b).

Measured per probe (:func:`measure_step`): parameter, gradient and optimizer-state bytes
are counted exactly from the tensors; activation bytes are what autograd saves for the
backward pass (``torch.autograd.graph.saved_tensors_hooks``, unique storages, parameters
excluded); batch bytes are the input and label tensors. Fitted (:func:`fit`) linear in the
local batch b, which gives the predicted memory of every grid point and the largest local
batch that fits the configured device budget.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np
import pandas as pd

from tula.linfit import LinearFit, fit_linear

if TYPE_CHECKING:
    import torch

# The measurement functions import torch themselves: the model (fit, predict, select) needs none.


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes of each term of Eq. 3 for one training step at one local batch."""

    param_bytes: int
    grad_bytes: int
    opt_bytes: int
    act_bytes: int
    batch_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.opt_bytes + self.act_bytes + self.batch_bytes

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "model_total_bytes": self.total_bytes}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


@contextlib.contextmanager
def saved_activation_bytes(exclude: set[tuple[str, int]]) -> Iterator[dict[str, int]]:
    """Count the bytes of unique storages autograd saves for backward inside the block."""
    import torch

    seen: set[tuple[str, int]] = set(exclude)
    total = {"bytes": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in seen:
            seen.add(key)
            total["bytes"] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield total


def measure_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    forward_loss: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    x: torch.Tensor,
    y: torch.Tensor,
) -> MemoryBreakdown:
    """Run one forward/backward/step and count each term of Eq. 3.

    ``forward_loss(x, y) -> (logits, loss)`` is the training step's own forward (its autocast
    precision and memory format), so saved activations are counted at the dtype training
    keeps them in."""
    import torch

    params = [p for p in model.parameters()]
    param_keys = {_storage_key(p) for p in params}
    optimizer.zero_grad(set_to_none=True)
    with saved_activation_bytes(param_keys) as act:
        _, loss = forward_loss(x, y)
    loss.backward()
    optimizer.step()
    opt_bytes = sum(
        _nbytes(v) for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)
    )
    return MemoryBreakdown(
        param_bytes=sum(_nbytes(p) for p in params),
        grad_bytes=sum(_nbytes(p.grad) for p in params if p.grad is not None),
        opt_bytes=opt_bytes,
        act_bytes=act["bytes"],
        batch_bytes=_nbytes(x) + _nbytes(y),
    )


def cpu_step_peak_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, run_step: Callable[[], Any]) -> int:
    """Measured peak of live tensor bytes during one training step on CPU.

    CPU has no ``max_memory_allocated``; torch's profiler records every allocation and free
    inside ``run_step`` (the training step itself, batch fetch included: memory timeline),
    whose running peak is taken. Tensors that already exist before the step and persist
    (parameters, optimizer state) are invisible to it and are added, counted exactly. DDP's
    gradient buckets, allocated when DDP is built, are not seen on CPU (a constant,
    independent of the batch); on CUDA the probe uses ``torch.cuda.max_memory_allocated``
    instead, which sees everything.
    """
    import json
    import tempfile
    import warnings

    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        run_step()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated in favour of CUDA-only snapshots
        path = f"{tmp}/timeline.json"
        prof.export_memory_timeline(path, device="cpu")
        with open(path) as fh:
            _, sizes = json.load(fh)
    transient = max((sum(s) for s in sizes), default=0)
    persistent = sum(_nbytes(p) for p in model.parameters()) + sum(
        _nbytes(v) for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v)
    )
    return int(transient + persistent)


@dataclass(frozen=True)
class MemoryModel:
    """Peak memory per worker = intercept + slope * local_batch (bytes)."""

    fit: LinearFit
    budget_bytes: float | None

    def predict_bytes(self, local_batch: float | np.ndarray) -> np.ndarray:
        return np.maximum(self.fit.predict(local_batch), 0.0)

    def max_local_batch(self) -> int | None:
        """Largest local batch whose predicted memory fits the budget (None = unbounded)."""
        if self.budget_bytes is None:
            return None
        if self.fit.slope <= 0:
            return None if self.fit.intercept <= self.budget_bytes else 0
        b = (self.budget_bytes - self.fit.intercept) / self.fit.slope
        return max(int(np.floor(b + 1e-9 * max(abs(b), 1.0))), 0)  # tolerate rounding just below a whole batch

    def feasible(self, local_batch: float | np.ndarray) -> np.ndarray:
        """True where the local batch is at most :meth:`max_local_batch`."""
        b = np.asarray(local_batch, dtype=float)
        limit = self.max_local_batch()
        return np.ones_like(b, dtype=bool) if limit is None else b <= limit

    def to_dict(self) -> dict[str, Any]:
        return {
            "equation": "peak_mem_bytes = intercept + slope * local_batch  (Eq. 3, linear in b)",
            "fit": self.fit.to_dict(),
            "budget_bytes": self.budget_bytes,
            "max_local_batch": self.max_local_batch(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MemoryModel":
        return cls(fit=LinearFit.from_dict(d["fit"]), budget_bytes=d.get("budget_bytes"))


def fit(measurements: pd.DataFrame, budget_bytes: float | None) -> MemoryModel:
    """Fit peak memory against local batch over the successful probes."""
    ok = measurements[measurements["status"] == "ok"]
    return MemoryModel(
        fit=fit_linear(ok["local_batch"], ok["peak_mem_bytes"], what="memory model (peak_mem_bytes vs local_batch)"),
        budget_bytes=budget_bytes,
    )
