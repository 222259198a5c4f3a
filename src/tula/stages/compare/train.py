"""Training one run of the suite (``tula compare run``): a real training with ``compare.workers``
workers, submitted like the production job, its result.json written atomically, last."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from tula import config as config_mod
from tula.io import write_json
from tula.production import launcher, relaunch
from tula.stages.compare.cells import Metric
from tula.stages.compare.runs import Run, find


def _run_config(raw: dict, run: Run, cmp: config_mod.CompareSettings) -> dict:
    d = json.loads(json.dumps(raw))
    d["workload"].update(model=run.model, dataset=run.dataset, seed=run.seed, epochs=cmp.epochs)
    d["train"]["method"] = run.method
    d["train"]["lr"] = raw["train"]["lr"]  # None -> the new model's family default
    d["train"]["weight_decay"] = raw["train"]["weight_decay"]
    return d


def run_one(
    cfg_path: str | Path,
    run_id: str,
    out: str | Path,
    executor_hint: str | None = None,
    timeout_min: int | None = None,
    partition: str | None = None,
    account: str | None = None,
) -> dict:
    """Train one run of the suite and write its result.json (``out``) atomically, last."""
    raw = config_mod.validate(
        __import__("yaml").safe_load(Path(cfg_path).read_text()), str(cfg_path)
    )
    cfg = config_mod.from_dict(raw, str(cfg_path))
    run = find(cfg, run_id)
    out = Path(out)
    d = out.parent
    run_cfg = config_mod.from_dict(_run_config(raw, run, cfg.compare), f"{cfg_path} ({run.id})")
    result: dict[str, Any] = {"run": run.id, **asdict(run), "workers": cfg.compare.workers}
    result["started"] = time.time()
    print(
        f"[compare] {run.id}: {cfg.compare.epochs} epochs at N={cfg.compare.workers} "
        f"B={run.global_batch}, method {run.method}, seed {run.seed}",
        flush=True,
    )
    try:
        final = launcher.train(
            run_cfg,
            (cfg.compare.workers, run.global_batch),
            d,
            executor_hint=executor_hint,
            timeout_min=timeout_min,
            partition=partition,
            account=account,
            shrink=False,
            job_name=f"tula-compare-{run.id}",
        )
    except relaunch.OutOfMemory as exc:
        result.update(status="oom", error=str(exc), epochs=[])
    else:
        epochs = pd.read_csv(d / "metrics.csv")[["epoch", "test_acc", "epoch_time_s"]]
        result.update(status="ok", error="", test_acc=final["final_test_acc"])
        result.update(best_test_acc=final["best_test_acc"], train_time_s=final["train_time_s"])
        result["epochs"] = epochs.to_dict(orient="records")
    result["ended"] = time.time()
    write_json(out, result)
    acc = (
        f"test {Metric.of(run_cfg.train).show(result['test_acc'])}"
        if result["status"] == "ok"
        else result["error"]
    )
    print(f"[compare] {run.id}: {result['status']}, {acc} -> {out}", flush=True)
    return result
