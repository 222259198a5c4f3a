"""Generalization suite (paper §IV-D, Table I): test accuracy per model x batch x method.

Every run is a real training with ``compare.nodes`` workers (gloo on CPU), submitted like
the production job (:func:`tula.launch.run`, submitit's local executor) and running the same
training step, under the config's ``train`` settings with ``train.method`` and the
seed replaced. Runs live in ``<out>/runs/<id>/``; a run whose final.json exists is reused, so
an interrupted suite continues where it stopped. Outputs:

- ``accuracy.csv``: one row per run (model, dataset, global_batch, method, seed, status,
  test_acc, best_test_acc, train_time_s), rewritten atomically after every run;
- ``table.md``: mean ± std over seeds, one row per (model, dataset, B), best mean in bold,
  and the summary the paper reports (AGS minus LBT, and how often AGS is best or within
  1 point of the best);
- ``heatmap.png``: mean accuracy per row and method.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tula import config as config_mod
from tula.io import read_json, write_csv, write_json
from tula.progress import Progress

COLUMNS = ["model", "dataset", "global_batch", "method", "seed", "status", "test_acc", "best_test_acc",
           "train_time_s", "error"]  # fmt: skip


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
    return [Run(w.model, w.dataset, b, m, s) for w in c.workloads for b in c.batches for s in range(c.seeds)
            for m in c.methods]  # fmt: skip


def _run_config(raw: dict, run: Run, epochs: int) -> dict:
    d = json.loads(json.dumps(raw))
    d["workload"].update(model=run.model, dataset=run.dataset, seed=run.seed, epochs=epochs)
    d["train"]["method"] = run.method
    d["launch"]["executor"] = "local"  # runs on this machine (or inside the compare job's allocation)
    d["train"]["lr"] = raw["train"]["lr"]  # None -> the new model's family default
    d["train"]["weight_decay"] = raw["train"]["weight_decay"]
    return d


def run_suite(cfg_path: str | Path, out: str | Path) -> pd.DataFrame:
    from tula import launch

    raw = config_mod.validate(__import__("yaml").safe_load(Path(cfg_path).read_text()), str(cfg_path))
    cfg = config_mod.from_dict(raw, str(cfg_path))
    out = Path(out)
    todo = runs(cfg)
    rows: list[dict] = []
    progress = Progress("compare", len(todo), unit="run", every_s=0.0)
    print(f"[compare] {len(todo)} runs: {len(cfg.compare.workloads)} workload(s) x {len(cfg.compare.batches)} batches x "
          f"{len(cfg.compare.methods)} methods x {cfg.compare.seeds} seeds, N={cfg.compare.nodes}, "
          f"{cfg.compare.epochs} epochs each", flush=True)  # fmt: skip
    for i, r in enumerate(todo, 1):
        d = out / "runs" / r.id
        final = d / "final.json"
        row = {"model": r.model, "dataset": r.dataset, "global_batch": r.global_batch, "method": r.method,
               "seed": r.seed, "error": ""}  # fmt: skip
        if not final.exists():
            write_json(d / "config.json", _run_config(raw, r, cfg.compare.epochs))
            write_json(d / "selection.json", {"selected": {"nodes": cfg.compare.nodes, "global_batch": r.global_batch}})
            t0 = time.perf_counter()
            try:
                launch.run(d / "config.json", d / "selection.json", d, executor_hint="local")
            except (RuntimeError, ValueError) as exc:
                row.update(status="error", error=str(exc), train_time_s=time.perf_counter() - t0)
        if final.exists():
            f = read_json(final)
            row.update(status="ok", test_acc=f["final_test_acc"], best_test_acc=f["best_test_acc"],
                       train_time_s=f["train_time_s"])  # fmt: skip
        rows.append(row)
        write_csv(out / "accuracy.csv", pd.DataFrame(rows, columns=COLUMNS))
        acc = f"{100 * row['test_acc']:.2f}%" if row.get("status") == "ok" else row.get("status")
        progress.update(i, "", extra=f"{r.id}: {acc}")
    df = pd.DataFrame(rows, columns=COLUMNS)
    (out / "table.md").write_text(table_markdown(df))
    heatmap(df, out / "heatmap.png")
    return df


def cell_stats(df: pd.DataFrame) -> pd.DataFrame:
    ok = df[df["status"] == "ok"]
    g = ok.groupby(["model", "dataset", "global_batch", "method"])["test_acc"]
    return pd.DataFrame({"mean": 100 * g.mean(), "std": 100 * g.std(ddof=1).fillna(0.0), "n": g.size()}).reset_index()


def table_markdown(df: pd.DataFrame) -> str:
    st = cell_stats(df)
    methods = [m for m in ["lbt", "lars", "polo", "lrs", "static", "ags"] if m in set(st["method"])]
    lines = ["| model | dataset | B | " + " | ".join(m.upper() if m != "ags" else "Tula AGS" for m in methods) + " |",
             "|---|---|---|" + "---|" * len(methods)]  # fmt: skip
    gains, near_best, cells = [], 0, 0
    for (model, ds, b), g in st.groupby(["model", "dataset", "global_batch"]):
        means = dict(zip(g["method"], g["mean"]))
        best = max(means.values())
        cells_txt = []
        for m in methods:
            if m not in means:
                cells_txt.append("—")
                continue
            r = g[g["method"] == m].iloc[0]
            txt = f"{r['mean']:.2f} ± {r['std']:.2f}"
            cells_txt.append(f"**{txt}**" if means[m] == best else txt)
        lines.append(f"| {model} | {ds} | {b} | " + " | ".join(cells_txt) + " |")
        if "ags" in means:
            cells += 1
            near_best += means["ags"] >= best - 1.0
            if "lbt" in means:
                gains.append(means["ags"] - means["lbt"])
    n = int(st["n"].min()) if len(st) else 0
    lines.append("")
    lines.append(f"Test accuracy (%), mean ± std over {n} seeds; best mean per row in bold.")
    if gains:
        lines.append(f"AGS − LBT, averaged over the {len(gains)} rows: {np.mean(gains):+.2f} points.")
    if cells:
        lines.append(f"AGS best or within 1 point of the best in {near_best}/{cells} rows.")
    return "\n".join(lines) + "\n"


def heatmap(df: pd.DataFrame, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tula.plots import _save

    st = cell_stats(df)
    if st.empty:
        return
    st = st.sort_values(["model", "dataset", "global_batch"])
    st["row"] = st["model"] + " / " + st["dataset"] + " / B=" + st["global_batch"].astype(str)
    piv = st.pivot(index="row", columns="method", values="mean").reindex(st["row"].unique())
    piv = piv[[m for m in ["lbt", "lars", "polo", "lrs", "static", "ags"] if m in piv.columns]]
    fig, ax = plt.subplots(figsize=(1.3 * len(piv.columns) + 3, 0.5 * len(piv) + 1.5))
    im = ax.imshow(piv.to_numpy(), cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(piv.columns)), [c.upper() for c in piv.columns])
    ax.set_yticks(range(len(piv)), piv.index)
    for i in range(len(piv)):
        row = piv.iloc[i].to_numpy()
        for j, v in enumerate(row):
            if v == v:
                ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=8,
                        fontweight="bold" if v == np.nanmax(row) else "normal")  # fmt: skip
    fig.colorbar(im, ax=ax, label="test accuracy (%)")
    ax.set_title("Test accuracy by method (mean over seeds)")
    _save(fig, path)
