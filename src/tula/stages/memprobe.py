"""``tula memprobe``: the memory probe, the stage before any timing probe.

It runs one worker (:mod:`tula.runtime.probe.memprobe_worker`) for a few seconds at a few local
batches (config key ``probe.memory_batches``; by default the grid's smallest local batch, x4
and x16) and measures each one's peak memory on a real training step -- a plain step and,
with AGS, a step that refreshes its factors, the larger counted. The memory model
(:mod:`tula.model.memory`) fitted on them gives b_max, the largest local batch that fits
``hardware.device_memory_gb`` less ``hardware.memory_margin``, and the search set
(:func:`tula.model.grid.search_set`) probes nothing beyond it: partial search takes the
largest B that fits instead of grid.batch_max. Snakemake runs it as a checkpoint, so the DAG
of probes is decided by its result.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tula import config as config_mod
from tula import model_inputs
from tula.io import read_json, write_json
from tula.model import estimated, memory
from tula.model.memory import probe_batches
from tula.workers import processes, script_launch
from tula.workers.script_run import ScriptRun

SCHEMA = "tula.memory_probe/1"


def _measure(
    cfg: config_mod.Config, cfg_path, batches: list[int], work: Path
) -> tuple[dict, float]:
    """The worker's result (a record of its failure if it wrote none) and its wall time."""
    if cfg.workload.script:
        return _measure_script(cfg, batches, work)
    print(f"[memprobe] one worker, local batches {batches}, model={cfg.workload.model}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    launch = processes.start(
        1,
        ["tula.runtime.probe.memprobe_worker", "--config", str(cfg_path), "--workers", "1"]
        + ["--local-batches", ",".join(map(str, batches)), "--result-dir", str(work)],
        threads_per_worker=cfg.hardware.threads_per_worker,
        timeout_s=cfg.probe.timeout_s,
        one_alone=True,  # it times nothing: no torchrun agent to wait for
    )
    res_path = processes.result_path(work, 0)
    res = (
        read_json(res_path)
        if res_path.exists()
        else {
            "status": "error",
            "points": [],
            "error": f"the worker exited (code {launch.returncode}) "
            "without a result" + (" (timeout)" if launch.timed_out else ""),
        }
    )
    shutil.rmtree(work, ignore_errors=True)
    return res, launch.wall_s


def _measure_script(cfg: config_mod.Config, batches: list[int], work: Path) -> tuple[dict, float]:
    """The user's script as the memory probe (:class:`tula.script.roles.Memory`): one launch
    per local batch, smallest first, each measuring one step's peak, until one runs out of
    memory; then the largest grid batch the fitted model says fits, as the worker does."""
    print(f"[memprobe] {cfg.workload.script}: one worker per local batch, {batches}", flush=True)
    out: dict = {"rank": 0, "status": "ok", "points": []}
    wall, todo = 0.0, list(batches)
    while todo:
        b = todo.pop(0)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        spec = ScriptRun("memory", 1, b, model_inputs.lr_at(cfg, b), cfg.workload.epochs, str(work))
        launch = script_launch.start(cfg, spec, cfg.probe.timeout_s)
        wall += launch.wall_s
        path = processes.result_path(work, 0)
        if not path.exists():
            why = " (timeout)" if launch.timed_out else ""
            out.update(
                status="error",
                error=f"the script exited (code {launch.returncode}) "
                f"without a result at local batch {b}{why}; see the log above",
            )
            break
        res = read_json(path)
        point = {**res["points"][0], "verifies_b_max": b not in batches}
        out["points"].append(point)
        out["env"] = res.get("env")
        peak = point.get("peak_mem_bytes")
        said = f"peak {peak / 2**20:.1f} MiB" if point["status"] == "ok" else point["status"]
        print(f"[memprobe] b={b}: {said}", flush=True)
        if point["status"] != "ok" and b in batches:
            break
        if not todo and b in batches:
            nxt = memory.next_probe_batch(
                model_inputs.grid_spec(cfg),
                model_inputs.probe_steps(cfg).memory_batches,
                cfg.hardware.memory_budget_bytes,
                out["points"],
            )
            todo = [nxt] if nxt is not None else []
    shutil.rmtree(work, ignore_errors=True)
    return out, wall


def _unless_ruled_out(batches: list[int], est: dict | None, budget) -> tuple[list, list]:
    """The batches to measure, and those the estimate rules out (the two smallest never: the
    memory model needs two points)."""
    skipped = [b for b in batches[2:] if estimated.clearly_out(est, budget, b)]
    if skipped:
        print(
            f"[memprobe] not measured, ruled out by the estimate (over the budget by more than "
            f"{estimated.CLEAR_MARGIN:.0%}): local batches {skipped}",
            flush=True,
        )
    return [b for b in batches if b not in skipped], skipped


def run(cfg_path: str | Path, out: str | Path, workload: str | Path | None = None) -> dict:
    """Measure memory at a few local batches on one worker, fit the memory model, write ``out``
    (results/memory_probe.json) with b_max. Stops with an error when nothing could be measured.
    ``workload`` (tula check's results/workload.json): the local batches its estimate rules out
    (:func:`tula.model.estimated.clearly_out`) are not measured, the two smallest always are,
    and the estimate's error against what was measured is written beside the memory model."""
    cfg = config_mod.load(cfg_path)
    est = read_json(workload).get("estimate") if workload else None
    budget = cfg.hardware.memory_budget_bytes
    batches, skipped = _unless_ruled_out(
        probe_batches(model_inputs.grid_spec(cfg), model_inputs.probe_steps(cfg).memory_batches),
        est,
        budget,
    )
    out = Path(out)
    res, wall_s = _measure(cfg, cfg_path, batches, out.parent / f".{out.stem}.ranks")
    ok = [p for p in res["points"] if p["status"] == "ok"]
    if not ok:
        raise RuntimeError(
            "memory probe: no local batch could be measured "
            f"({res.get('error') or res['points']}); see the log above"
        )
    model = memory.from_points(
        ok, [p for p in res["points"] if p["status"] == "oom"], cfg.hardware.memory_budget_bytes
    )
    record = {
        "schema": SCHEMA,
        "status": res["status"],
        "model": cfg.workload.model,
        "dataset": cfg.workload.dataset,
        "points": res["points"],
        "env": res.get("env"),
        "memory_model": model.to_dict(),
        "max_local_batch": model.max_local_batch(),
        "budget_bytes": cfg.hardware.memory_budget_bytes,
        "wall_s": wall_s,
        "estimate": est
        and {
            **{
                k: est[k] for k in ("device", "fixed_bytes", "per_sample_bytes", "flops_per_sample")
            },
            "ruled_out": [
                {"local_batch": b, "estimate_bytes": estimated.predict_bytes(est, b)}
                for b in skipped
            ],
            "against_probe": estimated.against_probe(est, ok, model.fit.to_dict()),
        },
    }
    write_json(out, record)
    if est:
        print(f"[memprobe] {describe_estimate(record['estimate']['against_probe'])}", flush=True)
    bmax = record["max_local_batch"]
    print(
        f"[memprobe] memory = {model.fit.intercept / 2**20:.1f} MiB + "
        f"{model.fit.slope / 2**10:.1f} KiB x b; largest local batch that fits: "
        f"{bmax if bmax is not None else 'unbounded'} -> {out}",
        flush=True,
    )
    return record


def describe_estimate(check: dict) -> str:
    """One sentence: how far the estimate from the model alone was from the memory probe."""
    if check["worst_error"] is None:
        return "the estimate could not be checked (no batch measured)"
    pts = ", ".join(f"b={r['local_batch']} {r['error']:+.0%}" for r in check["points"])
    verdict = (
        f"off by more than {check['bound']:.0%} at the largest: the probe's figures are used"
        if check["disagrees"]
        else f"within {check['bound']:.0%} at the largest"
    )
    return f"the estimate from the model alone against the memory probe: {pts} ({verdict})"
