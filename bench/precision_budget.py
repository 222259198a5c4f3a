"""What precision costs: the shipped default's grid probed at several `probe.time_budget_s`, the
precision each budget reaches, the seconds it costs and the held-out error it gives.

Every point of the default grid (search: full) is probed once per budget with the real probe
(`tula probe`, sweep rows included), the budgets interleaved point by point so a drift of the
machine falls on every budget alike. Truth of a point = the median of its step times over all
budgets. Per budget: the four corner probes' wall seconds (what `make run`'s partial search pays
for probing), the median 95 % half-width of their mean steps and how many reached
`probe.precision`, and the partial-search held-out error (fit on the corners, probe + sweep
rows, error at the other points against the truth).

    .venv/bin/python bench/precision_budget.py [--budgets 0.5 1 2 4 8]    # ~15 min on 2 cores

Prints a Markdown table (BENCHMARKS.md "Probe precision") and writes
results/fidelity/precision_budget.json.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from _harness import ROOT
from tula import config as config_mod
from tula import model_inputs
from tula.io import read_json, write_json
from tula.model import perf as perfmodel
from tula.model.grid import search_set
from tula.stages import memprobe, probe
from tula.stages.aggregate import rows_from_memory_probe, rows_from_probe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", nargs="+", type=float, default=[0.5, 1.0, 2.0, 4.0, 8.0])
    ap.add_argument("--out", default=str(ROOT / "results" / "fidelity" / "precision_budget"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load((ROOT / "workflow" / "config.yaml").read_text())
    paths = {}
    for b in a.budgets:
        r = {**raw, "search": "full", "probe": {**raw.get("probe", {}), "time_budget_s": b}}
        paths[b] = out / f"config_{b:g}.yaml"
        paths[b].write_text(yaml.safe_dump(r))
    cfg = config_mod.load(paths[a.budgets[0]])
    mp_path = out / "memory_probe.json"
    mp = read_json(mp_path) if mp_path.exists() else memprobe.run(paths[a.budgets[0]], mp_path)
    points = search_set(model_inputs.grid_spec(cfg), mp["max_local_batch"])
    corners = set(
        search_set(
            model_inputs.grid_spec(config_mod.from_dict({**raw, "search": "partial"})),
            mp["max_local_batch"],
        )
    )
    rows, t0 = [], time.perf_counter()
    for i, p in enumerate(points):
        for b in a.budgets:
            f = out / f"b{b:g}" / f"{p.name}.json"
            rec = (
                read_json(f)
                if f.exists()
                else probe.run(paths[b], p.workers, p.global_batch, f, memory_probe=mp_path)
            )
            if rec["status"] != "ok":
                raise SystemExit(f"{p.name} at budget {b}: {rec['status']}: {rec.get('error')}")
            rows += [{**row, "budget": b, "job": p} for row in rows_from_probe(rec, str(f))]
        print(
            f"[budget] point {i + 1}/{len(points)} ({time.perf_counter() - t0:.0f} s)", flush=True
        )
    m = pd.DataFrame(rows)
    mem_rows = pd.DataFrame(rows_from_memory_probe(mp, str(mp_path)))
    pr = m[m["source"] == "probe"]
    truth = pr.groupby(["workers", "global_batch"])["step_time_s"].median()
    held = [(p.workers, p.global_batch) for p in points if p not in corners]
    res = []
    for b in a.budgets:
        mb = m[m["budget"] == b]
        fit_rows = pd.concat([mb[mb["job"].isin(corners)], mem_rows], ignore_index=True)
        perf = perfmodel.fit(fit_rows, cfg.hardware.collective)
        pred = perf.step_time_s(
            np.array([n for n, _ in held], float), np.array([g // n for n, g in held], float)
        )
        err = 100 * np.abs(pred / np.array([truth[k] for k in held]) - 1)
        cp = mb[(mb["source"] == "probe") & mb["job"].isin(corners)]
        walls = [read_json(f)["wall_s"] for f in cp["probe_file"]]
        hw = np.maximum(cp["step_time_halfwidth_rel"], cp["compute_time_halfwidth_rel"])
        res.append(
            {
                "budget_s": b,
                "corner_probe_seconds": float(sum(walls)),
                "median_halfwidth_pct": 100 * float(np.median(hw)),
                "reached": int(cp["precision_reached"].astype(bool).sum()),
                "corners": len(cp),
                "partial_heldout_median_pct": float(np.median(err)),
                "partial_heldout_max_pct": float(np.max(err)),
            }
        )
    write_json(out.parent / "precision_budget.json", {"budgets": res, "points": len(points)})
    print(
        "\n| probe.time_budget_s | 4 corner probes, s | half-width (median) | reached | "
        "partial held-out (median / max) |"
    )
    print("|---:|---:|---:|---:|---:|")
    for r in res:
        print(
            f"| {r['budget_s']:g} | {r['corner_probe_seconds']:.1f} | "
            f"{r['median_halfwidth_pct']:.1f} % | {r['reached']} of {r['corners']} | "
            f"{r['partial_heldout_median_pct']:.1f} % / {r['partial_heldout_max_pct']:.1f} % |"
        )


if __name__ == "__main__":
    main()
