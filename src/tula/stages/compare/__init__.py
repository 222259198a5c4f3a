"""Generalization suite (paper §IV-D, Table I): test accuracy and time to a target accuracy
per model x batch x method, as a Snakemake fan-out (``rules/compare.smk``).

- ``rule compare_run`` (``tula compare run``): one job per run, i.e. per (workload, B, method, seed)
  in :func:`runs`. It is a real training with ``compare.workers`` workers, submitted like the
  production job (:func:`tula.production.launcher.train`: submitit, an sbatch job under the SLURM
  profile, local processes otherwise; requeued from its checkpoints) and running the same training
  step, under the config's ``train`` settings with ``train.method`` and the seed replaced. It writes
  ``runs/<id>/result.json``: the status, the final accuracies and every epoch's test accuracy and
  step time. A run that runs out of memory is a result (status ``oom``), not relaunched smaller: a
  cell is trained at its own B or not at all. Finished runs are Snakemake outputs; an interrupted
  run resumes from its checkpoint.
- ``rule compare`` (``tula compare aggregate``) reads every result.json and writes
  ``accuracy.csv`` (one row per run), ``table.md`` (mean ± std per cell, best per row in
  bold, AGS − LBT, and the median time to the target per cell) and ``heatmap.png``.

Time to target: the training-step time (``epoch_time_s``, evaluation excluded, as the step
model predicts) summed over the epochs up to the first whose test metric (``train.metric``,
accuracy by default) reaches the workload's target (``compare.workloads[].target_accuracy``,
else ``compare.target_fraction`` of the best mean final metric any cell of the workload
reached; for a metric where smaller is better, that best divided by the fraction). The table
and the heatmap are :mod:`tula.stages.compare.table`'s.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tula import config as config_mod
from tula.io import read_json, write_bytes, write_csv, write_json
from tula.production import launcher, relaunch
from tula.stages.compare.table import (  # noqa: F401 - the suite's table and figure, re-exported
    METHOD_ORDER,
    Metric,
    cell_stats,
    heatmap,
    median_time_input,
    table_markdown,
)

COLUMNS = [  # results/compare/accuracy.csv, in this order
    "model", "dataset", "global_batch", "method", "seed", "status", "test_acc", "best_test_acc",
    "train_time_s", "epochs", "target_acc", "time_to_target_s", "epochs_to_target", "error",
]  # fmt: skip


@dataclass(frozen=True)
class Run:
    model: str
    dataset: str
    global_batch: int
    method: str
    seed: int

    @property
    def id(self) -> str:
        ds = self.dataset.replace(":", "_").replace("/", "_")
        return f"{self.model}__{ds}__B{self.global_batch}__{self.method}__s{self.seed}"


def runs(cfg: config_mod.Config) -> list[Run]:
    c = cfg.compare
    return [
        Run(w.model, w.dataset, b, m, s)
        for w in c.workloads
        for b in c.batches
        for s in range(c.seeds)
        for m in c.methods
    ]


def run_ids(cfg: config_mod.Config) -> list[str]:
    """The suite's run ids, in order (the ``run`` wildcard of ``rule compare_run``)."""
    return [run.id for run in runs(cfg)]


def find(cfg: config_mod.Config, run_id: str) -> Run:
    for run in runs(cfg):
        if run.id == run_id:
            return run
    raise ValueError(
        f"run '{run_id}' is not in the suite of config keys compare.workloads x compare.batches x "
        f"compare.methods x compare.seeds ({len(runs(cfg))} runs)"
    )


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


def time_to_target(epochs: list[dict], target: float, goal: str = "max") -> tuple[float, int]:
    """(step time summed up to the first epoch whose test metric reaches target: at least it,
    or at most it where train.metric_goal is min; epochs that took); (nan, -1) when none did."""
    spent = 0.0
    for i, e in enumerate(epochs, 1):
        spent += float(e["epoch_time_s"])
        value = float(e["test_acc"])
        if (value <= target) if goal == "min" else (value >= target):
            return spent, i
    return float("nan"), -1


def targets(cfg: config_mod.Config, df: pd.DataFrame) -> dict[tuple[str, str], float]:
    """Each workload's target: its target_accuracy, else target_fraction of the best mean
    final metric of its cells (the best over the fraction where smaller is better)."""
    out, minimise = {}, cfg.train.metric_goal == "min"
    for w in cfg.compare.workloads:
        if w.target_accuracy is not None:
            out[w.model, w.dataset] = float(w.target_accuracy)
            continue
        ok = df[(df["model"] == w.model) & (df["dataset"] == w.dataset) & (df["status"] == "ok")]
        if len(ok):
            means = ok.groupby(["global_batch", "method"])["test_acc"].mean()
            fraction = cfg.compare.target_fraction
            # smaller is better (train.metric_goal: min): the best divided by the fraction
            target = means.min() / fraction if minimise else fraction * means.max()
            out[w.model, w.dataset] = float(target)
    return out


def collect(cfg: config_mod.Config, results: list[str | Path]) -> pd.DataFrame:
    """accuracy.csv's rows from the runs' result.json files, with time to each workload's target."""
    recs = [read_json(p) for p in results]
    df = pd.DataFrame(
        [
            {
                k: rec.get(k)
                for k in COLUMNS
                if k not in ("epochs", "target_acc", "time_to_target_s", "epochs_to_target")
            }
            for rec in recs
        ]
    )
    goal = targets(cfg, df)
    for i, rec in enumerate(recs):
        target = goal.get((rec["model"], rec["dataset"]))
        tt, et = (
            time_to_target(rec["epochs"], target, cfg.train.metric_goal)
            if target is not None
            else (float("nan"), -1)
        )
        df.loc[i, ["epochs", "target_acc", "time_to_target_s", "epochs_to_target"]] = (
            len(rec["epochs"]),
            target,
            tt,
            et if et > 0 else np.nan,
        )
    return df.reindex(columns=COLUMNS)


def aggregate(
    cfg_path: str | Path,
    results: list[str | Path],
    csv: str | Path,
    table: str | Path,
    heatmap_path: str | Path,
) -> pd.DataFrame:
    cfg = config_mod.load(cfg_path)
    df = collect(cfg, results)
    write_csv(csv, df)
    metric = Metric.of(cfg.train)
    write_bytes(table, table_markdown(df, metric).encode())
    heatmap(df, heatmap_path, metric)
    return df
