"""Does `objective: time_to_accuracy` choose the batch that really reaches a target accuracy
fastest?

For each dataset (digits, mnist1d), in a fresh copy of the workflow (results/bench_tta/<ds>/):

1. prediction: `snakemake --cores 2 --until select` with small_cnn, grid.workers [2], B 32…512,
   the shipped search (partial), probes, fit and predictions as a user gets them, and
   objective time_to_accuracy; then the choices of `time_to_accuracy`, `time` and `knee` on
   the same predictions.csv (tula.model.choice.select, objective replaced);
2. measurement: `snakemake --cores 2 compare`: every B of the grid trained with N = 2 and the
   production method (train.method, AGS) for EPOCHS epochs, SEEDS seeds each, one Snakemake
   job per run; time to target = training-step time summed to the first epoch whose test
   accuracy reaches the dataset's target (tula.stages.compare.collect.time_to_target). A seed
   that never reaches it counts as infinitely slow in the median.

Per dataset: measured time to target per B (median over seeds), the predicted one, each
objective's choice and its measured time against the measured best. Targets: the
time_to_accuracy choice within 10 % of the best measured time to target and better than
`time`'s choice. Writes results/bench_tta/tta.json and results/plots/tta_validation.png.

    .venv/bin/python bench/time_to_accuracy.py [--datasets digits mnist1d] [--seeds 3] [--epochs 20]

~14 min on 2 cores (two DAG runs to select, 30 training runs).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from _harness import ROOT, copy_workflow
from _harness import snakemake as run_snakemake
from tula import config as config_mod
from tula import model_inputs
from tula.io import read_json, write_json
from tula.model.choice import select
from tula.stages.compare.cells import median_time_input

# A target each dataset's base batch reaches within the shipped 15 epochs (pilot: digits
# reaches 99 % at B=128 in 4 epochs, mnist1d 96 % in 11), well above where large batches stall.
TARGETS = {"digits": 0.98, "mnist1d": 0.95}
BATCHES = [32, 64, 128, 256, 512]
OBJECTIVES = ("time_to_accuracy", "time", "knee")


def workdir(dest: Path) -> None:
    copy_workflow(dest)


def snakemake(wd: Path, *args: str) -> float:
    return run_snakemake(wd, *args)


def median_time(times: pd.Series) -> float:
    """Median over seeds; a seed that never reached the target is infinitely slow (as in the
    suite's table)."""
    return float(np.median(median_time_input(times).to_numpy()))


def run_dataset(ds: str, args, work: Path) -> dict:
    wd = work / ds
    workdir(wd)
    raw = {
        "workload": {"model": "small_cnn", "dataset": ds},
        "grid": {"workers": [2], "batch_min": min(BATCHES), "batch_max": max(BATCHES)},
        "objective": "time_to_accuracy",
        "compare": {
            "workloads": [{"model": "small_cnn", "dataset": ds, "target_accuracy": TARGETS[ds]}],
            "batches": BATCHES,
            "methods": ["ags"],
            "seeds": args.seeds,
            "workers": 2,
            "epochs": args.epochs,
        },
    }
    (wd / "workflow" / "config.yaml").write_text(yaml.safe_dump(raw))
    print(f"[tta] {ds}: probes, fit, predictions (snakemake --until combine) ...", flush=True)
    t_pred = snakemake(wd, "--until", "combine")
    print(
        f"[tta] {ds}: {len(BATCHES) * args.seeds} training runs (snakemake compare) ...", flush=True
    )
    t_meas = snakemake(wd, "compare")
    res = wd / "results"
    pred = pd.read_csv(res / "predictions.csv")
    cfg = config_mod.load(res.parent / ".snakemake" / "tula" / "config.json")
    choices = {}
    for obj in OBJECTIVES:
        sel = select(
            pred, model_inputs.planning(config_mod.from_dict({**cfg.to_dict(), "objective": obj}))
        )
        choices[obj] = sel.selected.global_batch
    acc = pd.read_csv(res / "compare" / "accuracy.csv")
    p2 = pred[pred["workers"] == 2].set_index("global_batch")
    rows = []
    for b, g in acc.groupby("global_batch"):
        rows.append(
            {
                "global_batch": int(b),
                "measured_s": median_time(g["time_to_target_s"]),
                "reached": int(g["time_to_target_s"].notna().sum()),
                "seeds": len(g),
                "epochs_to_target": float(g["epochs_to_target"].median())
                if g["epochs_to_target"].notna().any()
                else None,
                "step_time_s": float((g["train_time_s"] / g["epochs"]).median()),
                "final_acc": float(g["test_acc"].mean()),
                "predicted_s": float(p2.loc[b, "time_to_accuracy_s"]) if b in p2.index else None,
                "predicted_epochs": float(p2.loc[b, "epochs_to_accuracy"])
                if b in p2.index
                else None,
                "predicted_epoch_s": float(p2.loc[b, "train_time_s"] / cfg.workload.epochs)
                if b in p2.index
                else None,
            }
        )
    table = pd.DataFrame(rows).sort_values("global_batch")
    best = table.loc[table["measured_s"].idxmin()]
    measured = dict(zip(table["global_batch"], table["measured_s"]))
    sel = read_json(res / "selection.json")
    out = {
        "dataset": ds,
        "target": TARGETS[ds],
        "epochs_budget": args.epochs,
        "seeds": args.seeds,
        "b_noise": sel["noise"]["b_noise"],
        "b_noise_se": sel["noise"].get("b_noise_se"),
        "best_batch": int(best["global_batch"]),
        "best_s": float(best["measured_s"]),
        "choices": {},
        "table": table.to_dict(orient="records"),
        "wall_s": {"predict": t_pred, "measure": t_meas},
    }
    for obj, b in choices.items():
        out["choices"][obj] = {
            "global_batch": b,
            "measured_s": measured.get(b, np.inf),
            "vs_best": measured.get(b, np.inf) / float(best["measured_s"]),
        }
    return out


def markdown(res: list[dict]) -> str:
    lines = []
    for r in res:
        lines += [
            f"**{r['dataset']}**, target {100 * r['target']:.0f} % test accuracy, B_noise = "
            f"{r['b_noise']:.0f}"
            + (f" ± {r['b_noise_se']:.0f}" if r.get("b_noise_se") else "")
            + f" ({r['seeds']} seeds, "
            f"≤ {r['epochs_budget']} epochs, N = 2):",
            "",
            "| B | measured time to target (s, median) | reached | epochs to target | predicted "
            "(s) | predicted epochs | measured / predicted epoch (s) | final acc (%) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for t in r["table"]:
            ms = "not reached" if not np.isfinite(t["measured_s"]) else f"{t['measured_s']:.2f}"
            ms = f"**{ms}**" if t["global_batch"] == r["best_batch"] else ms
            ep = "—" if t["epochs_to_target"] is None else f"{t['epochs_to_target']:.0f}"
            pr = "—" if t["predicted_s"] is None else f"{t['predicted_s']:.2f}"
            pe = "—" if t["predicted_epochs"] is None else f"{t['predicted_epochs']:.1f}"
            pep = "—" if t["predicted_epoch_s"] is None else f"{t['predicted_epoch_s']:.3f}"
            lines.append(
                f"| {t['global_batch']} | {ms} | {t['reached']}/{t['seeds']} | {ep} | {pr} | {pe} "
                f"| {t['step_time_s']:.3f} / {pep} | {100 * t['final_acc']:.1f} |"
            )
        lines += [
            "",
            "| objective | chosen B | measured time to target (s) | / best |",
            "|---|---|---|---|",
        ]
        for obj, c in r["choices"].items():
            ms = "not reached" if not np.isfinite(c["measured_s"]) else f"{c['measured_s']:.2f}"
            vb = "∞" if not np.isfinite(c["vs_best"]) else f"{c['vs_best']:.2f}×"
            lines.append(f"| `{obj}` | {c['global_batch']} | {ms} | {vb} |")
        tta, tm = r["choices"]["time_to_accuracy"], r["choices"]["time"]
        same_b = tta["global_batch"] == tm["global_batch"]
        better = "yes" if tta["measured_s"] < tm["measured_s"] else ("same B" if same_b else "no")
        lines += [
            "",
            "time_to_accuracy within 10 % of the best: "
            f"**{'yes' if tta['vs_best'] <= 1.10 else 'no'}** "
            f"({tta['vs_best']:.2f}×); better than `time`'s choice: **{better}**.",
            "",
        ]
    return "\n".join(lines)


def plot(res: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(res), figsize=(6 * len(res), 4.2), squeeze=False)
    marks = {"time_to_accuracy": ("*", "C3"), "time": ("s", "C0"), "knee": ("D", "C2")}
    for ax, r in zip(axes[0], res):
        t = pd.DataFrame(r["table"])
        reached = t[np.isfinite(t["measured_s"])]
        ax.plot(
            reached["global_batch"],
            reached["measured_s"],
            "o-",
            color="k",
            label="measured (median over seeds)",
        )
        for b in t.loc[~np.isfinite(t["measured_s"]), "global_batch"]:
            ax.annotate(
                "not reached", (b, ax.get_ylim()[1] if len(reached) else 1), ha="center", fontsize=8
            )
        ax.plot(
            t["global_batch"],
            t["predicted_s"],
            "--",
            color="0.5",
            label="predicted (time_to_accuracy)",
        )
        for i, (obj, c) in enumerate(r["choices"].items()):
            y = c["measured_s"] if np.isfinite(c["measured_s"]) else reached["measured_s"].max()
            m, col = marks[obj]
            ax.plot(
                [c["global_batch"]],
                [y * (1 + 0.04 * i)],
                m,
                color=col,
                ms=11,
                label=f"{obj}: B={c['global_batch']}",
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("global batch B (N = 2)")
        ax.set_ylabel("training-step time to target (s)")
        ax.set_title(f"{r['dataset']}: time to {100 * r['target']:.0f} % test accuracy")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=20, help="epoch budget of each measured run")
    ap.add_argument("--work", default=str(ROOT / "results" / "bench_tta"))
    args = ap.parse_args()
    work = Path(args.work)
    res = [run_dataset(ds, args, work) for ds in args.datasets]
    write_json(work / "tta.json", res)
    plot(res, ROOT / "results" / "plots" / "tta_validation.png")
    print(markdown(res))


if __name__ == "__main__":
    main()
