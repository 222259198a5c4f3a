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
model predicts) summed over the epochs up to the first whose test accuracy is at least the
workload's target (``compare.workloads[].target_accuracy``, else ``compare.target_fraction``
of the best mean final accuracy any cell of the workload reached).
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
from tula.figures import plt, save_figure
from tula.io import read_json, write_bytes, write_csv, write_json
from tula.production import launcher, relaunch

METHOD_ORDER = ["lbt", "lars", "polo", "lrs", "static", "ags"]
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
        f"test accuracy {100 * result['test_acc']:.2f}%"
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
    final accuracy of its cells."""
    out = {}
    for w in cfg.compare.workloads:
        if w.target_accuracy is not None:
            out[w.model, w.dataset] = float(w.target_accuracy)
            continue
        ok = df[(df["model"] == w.model) & (df["dataset"] == w.dataset) & (df["status"] == "ok")]
        if len(ok):
            best = ok.groupby(["global_batch", "method"])["test_acc"].mean().max()
            out[w.model, w.dataset] = float(cfg.compare.target_fraction * best)
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
    write_bytes(table, table_markdown(df).encode())
    heatmap(df, heatmap_path)
    return df


def cell_stats(df: pd.DataFrame) -> pd.DataFrame:
    ok = df[df["status"] == "ok"]
    keys = ["model", "dataset", "global_batch", "method"]
    g = ok.groupby(keys)["test_acc"]
    st = pd.DataFrame(
        {"mean": 100 * g.mean(), "std": 100 * g.std(ddof=1).fillna(0.0), "n": g.size()}
    )
    if "time_to_target_s" in ok:
        t = ok.assign(t=median_time_input(ok["time_to_target_s"], ok["target_acc"])).groupby(keys)[
            "t"
        ]
        st["ttt_median"] = t.median()  # inf where most seeds never reached the target
        st["reached"] = ok.groupby(keys)["time_to_target_s"].count()  # NaN: never reached
    return st.reset_index()


def median_time_input(times: pd.Series, target: pd.Series | None = None) -> pd.Series:
    """Times to target ready for a median over seeds: a seed that never reached the target is
    infinitely slow (so a cell whose seeds mostly failed has no median time, and one where 2 of
    3 reached it has the slower of the two); NaN stays NaN only where there was no target."""
    filled = times.astype(float).fillna(np.inf)
    return filled if target is None else filled.where(target.notna())


def _methods(st: pd.DataFrame) -> list[str]:
    return [m for m in METHOD_ORDER if m in set(st["method"])]


def _grid(st: pd.DataFrame, methods: list[str], cell, best) -> list[str]:
    """The header, the rule and one row per (model, dataset, B) of a method table: ``cell(row)``
    gives a cell's text, None for a cell without a figure to compare; the best cell of a row
    (``best`` over the row's figures) is in bold."""
    lines = [
        "| model | dataset | B | "
        + " | ".join(m.upper() if m != "ags" else "Tula AGS" for m in methods)
        + " |",
        "|---|---|---|" + "---|" * len(methods),
    ]
    for (model, ds, b), g in st.groupby(["model", "dataset", "global_batch"]):
        by_method = {row["method"]: row for _, row in g.iterrows()}
        texts = {m: cell(row) for m, row in by_method.items()}
        top = best(g)
        cells = [
            "—"
            if m not in by_method
            else f"**{texts[m][0]}**"
            if texts[m][1] == top
            else texts[m][0]
            for m in methods
        ]
        lines.append(f"| {model} | {ds} | {b} | " + " | ".join(cells) + " |")
    return lines


def _accuracy_cell(row: pd.Series) -> tuple[str, float]:
    return f"{row['mean']:.2f} ± {row['std']:.2f}", row["mean"]


def _time_cell(row: pd.Series) -> tuple[str, float | None]:
    if not np.isfinite(row["ttt_median"]):
        return (
            f"{'median ' if row['reached'] else ''}not reached ({row['reached']}/{row['n']})",
            None,
        )
    return f"{row['ttt_median']:.2f} s ({row['reached']}/{row['n']})", row["ttt_median"]


def table_markdown(df: pd.DataFrame) -> str:
    """table.md: test accuracy per cell (mean ± std over seeds, best per row in bold, AGS's
    gain over LBT) and, with a target, the median time to it per cell (fastest in bold)."""
    st = cell_stats(df)
    methods = _methods(st)
    lines = _grid(st, methods, _accuracy_cell, lambda g: g["mean"].max())
    gains, near_best, rows = [], 0, 0
    for _, g in st.groupby(["model", "dataset", "global_batch"]):
        means = dict(zip(g["method"], g["mean"]))
        if "ags" in means:
            rows += 1
            near_best += means["ags"] >= max(means.values()) - 1.0
            if "lbt" in means:
                gains.append(means["ags"] - means["lbt"])
    lines += [
        "",
        f"Test accuracy (%), mean ± std over {int(st['n'].min()) if len(st) else 0} seeds; best "
        "mean per row in bold.",
    ]
    if gains:
        lines.append(
            f"AGS − LBT, averaged over the {len(gains)} rows: {np.mean(gains):+.2f} points."
        )
    if rows:
        lines.append(f"AGS best or within 1 point of the best in {near_best}/{rows} rows.")
    failed = df[df["status"] != "ok"]
    if len(failed):
        runs = [
            f"B={r.global_batch} {r.method} seed {r.seed} ({r.status})" for r in failed.itertuples()
        ]
        lines.append(f"Not trained: {', '.join(runs)}.")
    if "ttt_median" in st and df["target_acc"].notna().any():
        lines += [
            "",
            "### Time to target accuracy",
            "",
            *_grid(st, methods, _time_cell, lambda g: g["ttt_median"].min()),
        ]
        goals = df.groupby(["model", "dataset"])["target_acc"].first()
        lines += [
            "",
            "Training-step time (evaluation excluded) summed to the first epoch at or above the "
            "target, median over the seeds, one that never reached it counting as infinitely slow "
            "(reached/seeds); fastest per row in bold. Targets: "
            + ", ".join(f"{m} / {d}: {100 * t:.2f}%" for (m, d), t in goals.items() if t == t)
            + ".",
        ]
    return "\n".join(lines) + "\n"


def heatmap(df: pd.DataFrame, path: str | Path):
    """Mean accuracy per row (model / dataset / B) and method; beside it, the median time to
    target when the runs have one (a cell no median reached is drawn "—"). Returns the figure
    it saved, None when there is no run to draw."""
    st = cell_stats(df)
    if st.empty:
        return None
    st = st.sort_values(["model", "dataset", "global_batch"])
    st["row"] = st["model"] + " / " + st["dataset"] + " / B=" + st["global_batch"].astype(str)
    panels = [("mean", "test accuracy (%)", "RdYlGn", np.nanmax, "{:.1f}")]
    if "ttt_median" in st:
        st["ttt_median"] = st["ttt_median"].replace(np.inf, np.nan)  # not reached: no colour, "—"
        if st["ttt_median"].notna().any():
            panels.append(("ttt_median", "time to target (s)", "RdYlGn_r", np.nanmin, "{:.1f}"))
    rows = st["row"].unique()
    methods = _methods(st)
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(len(panels) * (1.3 * len(methods) + 3), 0.5 * len(rows) + 1.5),
        squeeze=False,
    )
    for ax, (col, label, cmap, best, fmt) in zip(axes[0], panels):
        piv = st.pivot(index="row", columns="method", values=col).reindex(rows)[methods]
        im = ax.imshow(piv.to_numpy(dtype=float), cmap=cmap, aspect="auto")
        ax.set_xticks(range(len(methods)), [c.upper() for c in methods])
        ax.set_yticks(range(len(piv)), piv.index if ax is axes[0][0] else [""] * len(piv))
        for i in range(len(piv)):
            row = piv.iloc[i].to_numpy(dtype=float)
            for j, v in enumerate(row):
                if v == v:
                    ax.text(
                        j,
                        i,
                        fmt.format(v),
                        ha="center",
                        va="center",
                        fontsize=8,
                        fontweight="bold" if v == best(row) else "normal",
                    )
                else:
                    ax.text(j, i, "—", ha="center", va="center", fontsize=8)
        fig.colorbar(im, ax=ax, label=label)
        ax.set_title(
            ("Test accuracy" if col == "mean" else "Time to target") + " by method (over seeds)"
        )
    save_figure(fig, path)
    return fig
