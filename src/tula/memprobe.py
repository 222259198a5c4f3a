"""The memory probe and the measurement of memory (Eq. 3); the stage before any timing probe.

``tula memprobe`` runs one worker for a few seconds at a few local batches (config key
``probe.memory_batches``; by default the grid's smallest local batch, x4 and x16) and
measures each one's peak memory on a real training step -- a plain step and, with AGS, a
step that refreshes its factors, the larger counted. The memory model (:mod:`tula.memory`)
fitted on them gives b_max, the largest local batch that fits ``hardware.device_memory_gb``
less ``hardware.memory_margin``, and the search set (:func:`tula.grid.search_set`) probes
nothing beyond it: partial search takes the largest B that fits instead of grid.batch_max.
Snakemake runs it as a checkpoint, so the DAG of probes is decided by its result.

Measurement: parameter, gradient and optimizer-state bytes are counted exactly from the
tensors (:func:`measure_step`); activation bytes are what autograd saves for backward
(``saved_tensors_hooks``, unique storages, parameters excluded); batch bytes are the input
and label tensors. The peak is ``torch.cuda.max_memory_allocated`` on CUDA and the
profiler's memory timeline on CPU (:func:`cpu_step_peak_bytes`).
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from tula import config as config_mod
from tula import dist
from tula.io import read_json, write_json

if TYPE_CHECKING:
    import torch

    from tula.train import Replica

SCHEMA = "tula.memory_probe/1"
EXTRA_MEMORY_POINTS = 2  # measurements at the fitted b_max (a second one when the first moved it)
PROFILER_TRIES = 3


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




def step_peak_bytes(r: Replica, refresh: bool = True, retries: dict[str, int] | None = None) -> dict[str, int]:
    """Peak memory of the replica's next training steps at its current batch: a plain step
    and, with AGS (and ``refresh``), a step that refreshes the factors (``refresh``). Each
    is measured on its own. ``retries`` (if given) gets, per kind, how many extra steps the
    profiler's failures cost."""
    import torch

    def measure(refresh: bool) -> int:
        if r.device.type == "cuda":
            r.force_refresh = refresh
            torch.cuda.synchronize(r.device)
            torch.cuda.reset_peak_memory_stats(r.device)
            r.next_timed_step()
            return int(torch.cuda.max_memory_allocated(r.device))
        # torch's profiler now and then fails to build the memory timeline of a step it
        # recorded (an AssertionError "version mismatch" in its data-flow graph, about one
        # probe in ten here). The step ran on every rank; the ranks agree whether every one
        # of them got a peak, and all measure one more step if not, so they stay in step.
        errors = []
        for attempt in range(PROFILER_TRIES):
            r.force_refresh = refresh
            try:
                peak, failed = cpu_step_peak_bytes(r.ddp, r.opt, r.next_timed_step), 0.0
            except AssertionError as exc:
                peak, failed = None, 1.0
                errors.append(str(exc).splitlines()[0][:200])
            if r.world > 1:
                flag = torch.tensor([failed])
                torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
                failed = float(flag.item())
            if not failed and peak is not None:
                if retries is not None:
                    retries["refresh" if refresh else "plain"] = attempt
                return peak
        raise RuntimeError(f"torch's profiler could not build a step's memory timeline in {PROFILER_TRIES} tries "
                           f"(on this rank: {errors or 'fine; another rank failed'})")  # fmt: skip

    if r.pos.offset == 0 and r.steps_per_epoch > 1:
        r.next_timed_step()  # an epoch's first step (loader refill, AGS refresh): not the plain step
    peaks = {"plain": measure(False)}
    if refresh and r.t.method == "ags":
        peaks["refresh"] = measure(True)
    return peaks


def default_batches(cfg: config_mod.Config) -> list[int]:
    """The local batches the memory probe measures: probe.memory_batches, or the grid's
    smallest local batch, x4 and x16, capped at the grid's largest local batch."""
    if cfg.probe.memory_batches:
        return sorted(set(cfg.probe.memory_batches))
    lo = max(cfg.grid.batch_min // max(cfg.grid.nodes), 1)
    hi = cfg.grid.batch_max // min(cfg.grid.nodes)
    return sorted({min(lo * f, hi) for f in (1, 4, 16)} | ({hi} if hi < lo * 4 else set()))


def next_batch(cfg: config_mod.Config, points: list[dict]) -> int | None:
    """The local batch to measure next, after the first ones, or None when done: the largest
    local batch of the grid that the memory model fitted so far says fits (where partial
    search's largest-B corner will run), when it lies beyond every batch measured and below
    any that ran out of memory. The memory model then rests on a measurement at b_max
    instead of a line extrapolated from small batches."""
    from tula import memory
    from tula.grid import batch_sizes

    ok = [p for p in points if p["status"] == "ok"]
    oom = [p for p in points if p["status"] == "oom"]
    if len(ok) < 2 or len(points) >= len(default_batches(cfg)) + EXTRA_MEMORY_POINTS:
        return None
    bmax = memory.from_points(ok, oom, cfg.hardware.memory_budget_bytes).max_local_batch()
    grid_b = sorted({b // n for n in cfg.grid.nodes for b in batch_sizes(cfg) if b // n >= 1})
    fits = [b for b in grid_b if bmax is None or b <= bmax]
    if not fits:
        return None
    b = fits[-1]
    return b if b > max(p["local_batch"] for p in ok) and b not in {p["local_batch"] for p in points} else None


def run_worker(cfg: config_mod.Config, batches: list[int], result_dir: Path) -> None:
    """One worker: peak memory at each local batch, smallest first, stopping at the first
    OOM; then at the largest grid batch the fitted model says fits (:func:`next_batch`)."""
    import torch

    from tula.train import Replica, StepOOM

    out: dict[str, Any] = {"rank": 0, "status": "ok", "points": []}
    try:
        wenv, device, backend = dist.init(cfg.hardware, timeout_s=cfg.probe.timeout_s)
        r = Replica(cfg, device, batches[0], 0, 1)
        out["env"] = {"device": device.type, "backend": backend, "precision": cfg.train.precision,
                      "method": cfg.train.method, "torch": torch.__version__}  # fmt: skip
        r.next_timed_step()  # the first step ever creates the optimizer state: not a measurement
        todo = list(batches)
        while todo:
            b = todo.pop(0)
            point: dict[str, Any] = {"local_batch": b, "verifies_b_max": b not in batches}
            try:
                r.set_global_batch(b)
                mem = measure_step(r.ddp, r.opt, r.forward_loss, *r.to_device(*next(r.epoch_batches())))
                peaks = step_peak_bytes(r)
                point.update(status="ok", peak_mem_bytes=max(peaks.values()), plain_peak_bytes=peaks["plain"],
                             refresh_peak_bytes=peaks.get("refresh"), memory=mem.to_dict())  # fmt: skip
            except (StepOOM, torch.OutOfMemoryError) as exc:
                point.update(status="oom", error=f"out of memory at local batch {b}: {str(exc).splitlines()[0] if str(exc) else ''}")
            out["points"].append(point)
            print(f"[memprobe] b={b}: " + (f"peak {point['peak_mem_bytes'] / 2**20:.1f} MiB" if point["status"] == "ok"
                                          else point["status"]), flush=True)  # fmt: skip
            if point["status"] != "ok" and b in batches:
                break
            if not todo:
                nxt = next_batch(cfg, out["points"])
                todo = [nxt] if nxt is not None else []
    except Exception as exc:  # recorded, never silently dropped
        out.update(status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    write_json(dist.result_path(result_dir, 0), out)
    dist.shutdown(ok=out["status"] == "ok")
    if out["status"] != "ok":
        sys.exit(1)


def run(cfg_path: str | Path, out: str | Path) -> dict:
    """Measure memory at a few local batches on one worker, fit the memory model, write ``out``
    (results/memory_probe.json) with b_max. Stops with an error when nothing could be measured."""
    import shutil

    from tula import memory

    cfg = config_mod.load(cfg_path)
    batches = default_batches(cfg)
    out = Path(out)
    work = out.parent / f".{out.stem}.ranks"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    print(f"[memprobe] one worker, local batches {batches}, model={cfg.workload.model}", flush=True)
    launch = dist.launch(1, ["tula.memprobe", "--config", str(cfg_path), "--nodes", "1", "--global-batch",
                             ",".join(map(str, batches)), "--result-dir", str(work)],
                         threads_per_worker=cfg.hardware.threads_per_worker, timeout_s=cfg.probe.timeout_s)  # fmt: skip
    res_path = dist.result_path(work, 0)
    res = read_json(res_path) if res_path.exists() else {"status": "error", "points": [],
                                                          "error": f"the worker exited (code {launch.returncode}) "
                                                                   "without a result" + (" (timeout)" if launch.timed_out else "")}  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    ok = [p for p in res["points"] if p["status"] == "ok"]
    if not ok:
        raise RuntimeError(f"memory probe: no local batch could be measured ({res.get('error') or res['points']}); "
                           "see the log above")  # fmt: skip
    model = memory.from_points(ok, [p for p in res["points"] if p["status"] == "oom"], cfg.hardware.memory_budget_bytes)
    record = {"schema": SCHEMA, "status": res["status"], "model": cfg.workload.model,
              "dataset": cfg.workload.dataset, "points": res["points"], "env": res.get("env"),
              "memory_model": model.to_dict(), "max_local_batch": model.max_local_batch(),
              "budget_bytes": cfg.hardware.memory_budget_bytes, "wall_s": launch.wall_s}  # fmt: skip
    write_json(out, record)
    bmax = record["max_local_batch"]
    print(f"[memprobe] memory = {model.fit.intercept / 2**20:.1f} MiB + {model.fit.slope / 2**10:.1f} KiB x b; "
          f"largest local batch that fits: {bmax if bmax is not None else 'unbounded'} -> {out}", flush=True)  # fmt: skip
    return record


def _worker_main(argv: list[str] | None = None) -> None:
    a = dist.parse_worker_args("tula.memprobe", "--result-dir", argv, batch_list=True)
    run_worker(config_mod.load(a.config), a.global_batch, Path(a.result_dir))


if __name__ == "__main__":
    _worker_main()
