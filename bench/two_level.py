"""Held-out step-time error of the sync model on multi-GPU nodes: Tula's
one-level model (every N on one curve, whatever the nodes), Tula's two-level model
(cluster.workers_per_node) and AdaptDL's performance model (``adaptdl.goodput.fit_perf_params``,
the ``bench`` extra: the package itself, fitted on the same probe rows), side by side.

A synthetic cluster of 8-GPU nodes written here, in a form none of Tula's candidates has:
compute flat while the GPU is under-used, then linear (c0 (1 + (b/b0)^4)^(1/4) + c1 b); a
hierarchical ring all-reduce of the model's fp32 gradient (reduce-scatter and all-gather
inside the node over NVLink, ring across the k nodes' NICs, each a latency plus bytes over
bandwidth); DDP overlap (the step is max(compute, forward + sync) smoothed); 2 % noise on
every measured time. Scenarios:

- resnet50: 25.6 M parameters (102 MB), 100 Gb/s between nodes: compute dominates;
- vgg11_100g: 133 M parameters (531 MB), 100 Gb/s between nodes: communication-heavy;
- vgg11_25g: the same over 25 GbE: communication dominates past one node.

Grid: N in {1, 2, 4, 8, 16, 32, 64}, B = 256 ... 16384 (every B >= 4 N). Partial search = the
probes Tula's search_set picks (corners and both sides of the node boundary: N = 1, 8, 16,
64 at the smallest and largest B); full = a random three quarters of the grid's points (a
new draw per seed), the error at the other quarter. Rows given to each
model: the probe rows (N, nodes, local batch, compute-only time, step time), nothing else.
Error = |predicted / true - 1| at every held-out point (true: the noiseless step).

    .venv/bin/pip install -e '.[bench]'       # adaptdl
    .venv/bin/python bench/two_level.py [--seeds 5]

Prints a Markdown table (BENCHMARKS.md "The step model's prediction") and writes
results/fidelity/two_level.json.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from _harness import ROOT
from tula import config as config_mod
from tula import model_inputs
from tula.io import write_json
from tula.model import perf as perfmodel
from tula.model.grid import grid, search_set

PER_NODE = 8
WORKERS = [1, 2, 4, 8, 16, 32, 64]
NOISE = 0.02
SCENARIOS = {
    # gradient bytes, inter-node bytes/s, compute c0 (s), c1 (s/sample), b0 (samples)
    "resnet50": (102e6, 12.5e9, 0.030, 1.2e-3, 24),
    "vgg11_100g": (531e6, 12.5e9, 0.020, 0.9e-3, 24),
    "vgg11_25g": (531e6, 3.1e9, 0.020, 0.9e-3, 24),
}
NVLINK = 130e9  # bytes/s of a ring step inside the node
LAT_INTRA, LAT_INTER = 10e-6, 30e-6  # per ring step


class Cluster:
    def __init__(self, grad_bytes, inter_bw, c0, c1, b0):
        self.m, self.bw, self.c0, self.c1, self.b0 = grad_bytes, inter_bw, c0, c1, b0

    def compute(self, b):
        b = np.asarray(b, float)
        return self.c0 * (1 + (b / self.b0) ** 4) ** 0.25 + self.c1 * b

    def sync(self, n):
        n = np.asarray(n, float)
        k = np.ceil(n / PER_NODE)
        g = n / k
        intra = 2 * (g - 1) / g * self.m / NVLINK + 2 * (g - 1) * LAT_INTRA
        inter = 2 * (k - 1) / k * self.m / self.bw + 2 * (k - 1) * LAT_INTER
        return intra + inter

    def step(self, n, b):
        c, s = self.compute(b), self.sync(n)
        fwd = c / 3
        return np.where(np.asarray(n) > 1, (c**4 + (fwd + s) ** 4) ** 0.25, c)


def rows(cl: Cluster, points, rng) -> pd.DataFrame:
    n = np.array([p.workers for p in points], float)
    b = np.array([p.local_batch for p in points], float)
    comp = cl.compute(b) * rng.normal(1, NOISE, len(b))
    step = cl.step(n, b) * rng.normal(1, NOISE, len(b))
    return pd.DataFrame(
        {
            "workers": n.astype(int),
            "nodes": np.ceil(n / PER_NODE).astype(int),
            "global_batch": [p.global_batch for p in points],
            "local_batch": b.astype(int),
            "compute_time_s": comp,
            "step_time_s": step,
            "sync_time_s": step - comp,
            "peak_mem_bytes": 1.0,
            "status": "ok",
            "source": "probe",
            "step_time_cv": NOISE,
        }
    )


def tula(train: pd.DataFrame, two_level: bool, per_node: int = PER_NODE):
    if two_level:
        perf = perfmodel.fit(train, "ring", workers_per_node=per_node)
    else:  # the one-level model: one curve in N, whatever the nodes (all on one "node")
        perf = perfmodel.fit(
            train.drop(columns="nodes"), "ring", workers_per_node=int(train["workers"].max())
        )
    return lambda n, b: perf.step_time_s(n, b), perf.step.form.name if perf.step else "-"


def adaptdl(train: pd.DataFrame, per_node: int = PER_NODE):
    """AdaptDL's model (the package's own fit and prediction functions) on the same rows:
    accumulation time = the compute-only step, optimizer step time = the synced step."""
    from adaptdl import goodput

    nodes = np.ceil(train["workers"].to_numpy() / per_node)
    p = goodput.fit_perf_params(
        nodes,
        train["workers"].to_numpy(),
        train["local_batch"].to_numpy(),
        train["compute_time_s"].to_numpy(),
        train["step_time_s"].to_numpy(),
    )

    def predict(n, b):
        n, b = np.asarray(n, float), np.asarray(b, float)
        accum = goodput._predict_accum_time(p, b)
        net = goodput._predict_network_time(p, np.ceil(n / per_node), n)
        return np.exp(goodput._predict_log_optim_time(p, accum, net))

    return predict, "adaptdl"


MODELS = {
    "tula_one_level": lambda t: tula(t, False),
    "tula_two_level": lambda t: tula(t, True),
    "adaptdl": adaptdl,
}


def errors(cl: Cluster, cfg, rng) -> dict:
    pts = [p for p in grid(model_inputs.grid_spec(cfg)) if p.local_batch >= 4]
    table = rows(cl, pts, rng)
    corners = {p.name for p in search_set(model_inputs.grid_spec(cfg))}
    name = [f"N{r.workers}_B{r.global_batch}" for r in table.itertuples()]
    table["point"] = name
    truth = cl.step(table["workers"], table["local_batch"])
    fitted = np.zeros(len(table), bool)  # full search: the same split for every model
    fitted[rng.permutation(len(table))[: 3 * len(table) // 4]] = True
    out: dict = {}
    for model, make in MODELS.items():
        train = table[table["point"].isin(corners)]
        held = ~table["point"].isin(corners)
        pred, form = make(train)
        part = np.abs(pred(table["workers"][held], table["local_batch"][held]) / truth[held] - 1)
        multi = (table["workers"][held] > PER_NODE).to_numpy()
        p_f, _ = make(table[fitted])
        full = np.abs(
            p_f(table["workers"][~fitted], table["local_batch"][~fitted]) / truth[~fitted] - 1
        )
        out[model] = {
            "partial": 100 * np.median(part),
            "partial_max": 100 * part.max(),
            "partial_multi_node": 100 * np.median(part[multi]),
            "full": 100 * np.median(full),
            "full_max": 100 * full.max(),
            "form": form,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    a = ap.parse_args()
    cfg = config_mod.from_dict(
        {
            "grid": {"workers": WORKERS, "batch_min": 256, "batch_max": 16384},
            "cluster": {"workers_per_node": PER_NODE},
        }
    )
    partial = search_set(model_inputs.grid_spec(cfg))
    print(f"partial search probes: {', '.join(p.name for p in partial)}")
    results: dict = {}
    t0 = time.time()
    for scen, params in SCENARIOS.items():
        runs = [
            errors(Cluster(*params), cfg, np.random.default_rng(seed)) for seed in range(a.seeds)
        ]
        results[scen] = {
            m: {
                k: (
                    float(np.median([r[m][k] for r in runs]))
                    if k != "form"
                    else sorted({r[m]["form"] for r in runs})
                )
                for k in runs[0][m]
            }
            for m in MODELS
        }
        print(f"{scen}: done ({time.time() - t0:.0f} s)", flush=True)
    write_json(
        ROOT / "results" / "fidelity" / "two_level.json",
        {"seeds": a.seeds, "noise": NOISE, "results": results},
    )
    print("\nmedian held-out step-time error over seeds of the per-seed median (max) over points\n")
    print(
        "| scenario | search | Tula one-level | Tula two-level | AdaptDL "
        "|\n|---|---|---:|---:|---:|"
    )
    for scen, r in results.items():
        for search in ("partial", "full"):
            cells = [f"{r[m][search]:.1f} % (max {r[m][search + '_max']:.0f} %)" for m in MODELS]
            print(f"| {scen} | {search} | " + " | ".join(cells) + " |")
        cells = [f"{r[m]['partial_multi_node']:.1f} %" for m in MODELS]
        print(f"| {scen} | partial, multi-node points only | " + " | ".join(cells) + " |")
    print(
        "\nforms chosen (two-level): "
        + "; ".join(f"{s}: {', '.join(r['tula_two_level']['form'])}" for s, r in results.items())
    )


if __name__ == "__main__":
    main()
