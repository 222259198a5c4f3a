"""The memory probe's worker (``python -m tula.runtime.probe.memprobe_worker``, started by
``tula memprobe``): one worker measures the peak memory of real training steps at a few
local batches, smallest first, stopping at the first out-of-memory error; then at the
largest grid batch the fitted model says fits (:func:`tula.model.memory.next_probe_batch`).
It writes ``<result-dir>/rank0.json``, also when it fails."""

from __future__ import annotations

import dataclasses
import functools
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from tula import config as config_mod
from tula import model_inputs
from tula.io import write_json
from tula.model.memory import next_probe_batch
from tula.runtime.group import dist
from tula.runtime.group.agreement import StepOOM
from tula.runtime.probe.measure import measure_step, step_peak_bytes
from tula.runtime.step.replica import Replica
from tula.workers.args import parse_worker_args
from tula.workers.processes import result_path
from tula.workers.stacks import dump_stacks_before_deadline


def run_worker(cfg: config_mod.Config, batches: list[int], result_dir: Path) -> None:
    """One worker: peak memory at each local batch, smallest first, stopping at the first
    OOM; then at the largest grid batch the fitted model says fits (:func:`next_probe_batch`)."""
    dump_stacks_before_deadline()
    out: dict[str, Any] = {"rank": 0, "status": "ok", "points": []}
    try:
        wenv, device, backend = dist.init(
            cfg.hardware, timeout_s=cfg.probe.timeout_s, cluster=cfg.cluster
        )
        # one batch a step, whatever train.accumulate says: b_max is the largest that fits so
        one = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, accumulate=1))
        replica = Replica(one, device, batches[0], 0, 1)
        out["env"] = {
            "device": device.type,
            "backend": backend,
            "comm_env": dist.comm_env(),
            "precision": cfg.train.precision,
            "method": cfg.train.method,
            "torch": torch.__version__,
        }
        # the first step ever creates the optimizer state: not a measurement
        replica.walk.next_timed_step()
        todo = list(batches)
        while todo:
            b = todo.pop(0)
            point = _measure_at(replica, b, verifies_b_max=b not in batches)
            out["points"].append(point)
            print(
                f"[memprobe] b={b}: "
                + (
                    f"peak {point['peak_mem_bytes'] / 2**20:.1f} MiB"
                    if point["status"] == "ok"
                    else point["status"]
                ),
                flush=True,
            )
            if point["status"] != "ok" and b in batches:
                break
            if not todo:
                nxt = next_probe_batch(
                    model_inputs.grid_spec(cfg),
                    model_inputs.probe_steps(cfg).memory_batches,
                    cfg.hardware.memory_budget_bytes,
                    out["points"],
                )
                todo = [nxt] if nxt is not None else []
    except Exception as exc:  # noqa: BLE001 - recorded, never silently dropped
        out.update(
            status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()
        )
    write_json(result_path(result_dir, 0), out)
    dist.shutdown(ok=out["status"] == "ok")
    if out["status"] != "ok":
        sys.exit(1)


def _measure_at(replica: Replica, b: int, verifies_b_max: bool) -> dict[str, Any]:
    """Peak memory of one step at local batch ``b`` (an OOM recorded as such)."""
    point: dict[str, Any] = {"local_batch": b, "verifies_b_max": verifies_b_max}
    try:
        replica.set_global_batch(b)
        mem = measure_step(
            replica.ddp,
            replica.update.opt,
            functools.partial(replica.forward_loss, eager=True),
            *replica.to_device(*next(replica.walk.epoch_batches())),
        )
        peaks = step_peak_bytes(replica)
        point.update(
            status="ok",
            peak_mem_bytes=max(peaks.values()),
            plain_peak_bytes=peaks["plain"],
            refresh_peak_bytes=peaks.get("refresh"),
            memory=mem.to_dict(),
        )
    except (StepOOM, torch.OutOfMemoryError) as exc:
        point.update(
            status="oom",
            error=f"out of memory at local batch {b}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}",
        )
    return point


def _worker_main(argv: list[str] | None = None) -> None:
    a = parse_worker_args(
        "tula.runtime.probe.memprobe_worker", argv, batch_flag="--local-batches", batch_list=True
    )
    run_worker(config_mod.load(a.config), a.local_batches, Path(a.result_dir))


if __name__ == "__main__":
    _worker_main()
