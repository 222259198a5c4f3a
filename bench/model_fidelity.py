"""Fidelity of Tula's memory, step-time and knee models.

Five parts, each in fidelity.json and printed as a Markdown table (BENCHMARKS.md
"The step model's prediction"):

(a) this machine: the shipped config's whole grid, probed REPEATS times with the real probe
    (`tula probe`: its sweep rows included; repeats interleaved, so drift hits every point
    alike), in two jobs per N: the corners (what a partial search runs, its sweep included),
    then the other points. Truth of a point = median of its repeats. Noise floor = how far
    one measurement lies from the truth, median over points and repeats (noise_floor()).
    Held-out error, per repeat: partial = fit on the 4 corner jobs (probe + sweep rows +
    the memory probe), error at the other points; full = leave one job out (its probe and
    sweep rows), predict its point. Target: median held-out error <= 1.2 x noise floor.
(b) a synthetic GPU cluster written here, in a form none of Tula's candidates has: compute
    smoothly flat while a V100 is under-used then linear (c0 (1 + (b/b0)^4)^(1/4)), DDP-like
    overlap (forward, then backward overlapped with all of the sync but the last bucket),
    alpha-beta ring all-reduce of a 100 MB gradient over 10 GbE, 3 % noise on every measured
    time, 0.5 % on memory (allocator blocks), a 32 GB memory bound (peak = 2 GB + 60 MB x b,
    so b_max = 446 with the 10 % margin). Probe jobs are simulated with Tula's own rules:
    memory probe (default batches, then its check at b_max), search set, one sweep per job
    (one job per N, swept at its first point). Partial (with and
    without sweep rows) and full (leave one job out); median / max held-out step-time error.
    Targets: partial <= 5 %, full <= 2 % median.
(c) knee stability, on (b) with a smaller model's memory (10 MB a sample: the batch range,
    not memory, ends the curve): grid.batch_max halved (4096) and doubled (16384) around 8192;
    the knee of the partial-search prediction for the marginal rule and Kneedle, and the
    true T at each knee against the true minimum. Target: the marginal knee moves by at most
    one doubling, its true T within 1.5 x the minimum.
(d) probes spent on points the memory bound excludes, on (b): the old corners (min/max N x
    batch_min/batch_max) against feasible-first (b_max from the memory probe), also with 3 %
    memory noise.
(e) production vs prediction: every final.json given (default: results/train/final.json of
    the last `make run`) and bench/probe_vs_production.py's table when it has been run.

    .venv/bin/python bench/model_fidelity.py [--parts abcde] [--repeats 3] [--seeds 20]

(a) takes ~10 min on 2 cores; (b)-(d) ~3 min (fits only). Writes results/fidelity/fidelity.json
and results/plots/fidelity_*.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from _harness import ROOT
from tula import config as config_mod
from tula import model_inputs
from tula.io import read_json, write_json
from tula.model import memory
from tula.model import perf as perfmodel
from tula.model.choice import select
from tula.model.grid import Point, batch_sizes, grid, search_set, sweep_local_batches
from tula.stages.aggregate import rows_from_memory_probe, rows_from_probe
from tula.stages.predict import predict


def pct(pred, true) -> np.ndarray:
    return (
        100.0 * np.abs(np.asarray(pred, float) - np.asarray(true, float)) / np.asarray(true, float)
    )


def summary(errors) -> dict:
    e = np.asarray(list(errors), float)
    return (
        {"median_pct": float(np.median(e)), "max_pct": float(np.max(e)), "n": int(e.size)}
        if e.size
        else {"n": 0}
    )


def step_of(perf: perfmodel.PerfModel, points) -> np.ndarray:
    return perf.step_time_s(
        np.array([p[0] for p in points], float), np.array([p[1] // p[0] for p in points], float)
    )


# -- (a) this machine ---------------------------------------------------------------------


def noise_floor(probes: pd.DataFrame) -> float:
    """How far one measurement lies from its point's true step time, % (median): each repeat
    against the mean of the point's other repeats, scaled by 1/sqrt(1 + 1/(k-1)) for the
    other repeats' own noise. (|repeat - median of all| would be zero for every median
    repeat: with 3 repeats it reads a third of the points as noiseless.)"""
    devs = []
    for _, g in probes.groupby(["workers", "global_batch"]):
        t = g["step_time_s"].to_numpy(float)
        k = len(t)
        if k < 2:
            continue
        for i in range(k):
            devs.append(100 * abs(t[i] / np.delete(t, i).mean() - 1) / np.sqrt(1 + 1 / (k - 1)))
    return float(np.median(devs))


def part_a(repeats: int, out: Path) -> dict:
    from tula.stages import memprobe, probe

    raw = yaml.safe_load((ROOT / "workflow" / "config.yaml").read_text())
    raw["search"] = "full"
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    cfg = config_mod.load(cfg_path)
    mp_path = out / "memory_probe.json"
    mp = read_json(mp_path) if mp_path.exists() else memprobe.run(cfg_path, mp_path)
    bmax = mp["max_local_batch"]
    points = search_set(model_inputs.grid_spec(cfg), bmax)
    corners = set(
        search_set(model_inputs.grid_spec(config_mod.from_dict({**raw, "search": "partial"})), bmax)
    )
    rows, t0 = [], time.perf_counter()
    for r in range(repeats):
        files = {p: out / "probes" / f"r{r}" / f"{p.name}.json" for p in points}
        # per N, the corners' job as a partial search runs it (its sweep times the local
        # batches between, which a job leaves to the points it probes), then the other points'
        jobs = sorted({(p.workers, p in corners) for p in points}, key=lambda j: (j[0], not j[1]))
        for n, group in jobs:
            todo = [
                p.global_batch
                for p in points
                if p.workers == n and (p in corners) == group and not files[p].exists()
            ]
            if todo:
                outs = {b: files[Point(n, b)] for b in todo}
                probe.run_batches(cfg_path, n, todo, outs, memory_probe=mp_path)
        for i, p in enumerate(points):
            f = files[p]
            rec = read_json(f)
            if rec["status"] != "ok":
                sys.exit(f"probe {p.name} repeat {r} failed: {rec.get('error')}")
            rows += [{**row, "repeat": r, "job": p} for row in rows_from_probe(rec, str(f))]
            print(
                f"[fidelity a] repeat {r + 1}/{repeats}, point {i + 1}/{len(points)} "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    m = pd.DataFrame(rows)
    mem_rows = pd.DataFrame(rows_from_memory_probe(mp, str(mp_path)))
    pr = m[m["source"] == "probe"]
    truth = pr.groupby(["workers", "global_batch"])["step_time_s"].median()
    floor = noise_floor(pr)
    errs: dict[str, list[float]] = {
        "partial": [],
        "partial_without_sweep": [],
        "full": [],
        "partial_on_corners": [],
    }
    forms: dict[str, list[str]] = {"partial": [], "full": []}
    for r in range(repeats):
        mr = m[m["repeat"] == r]
        fit_rows = pd.concat([mr[mr["job"].isin(corners)], mem_rows], ignore_index=True)
        perf = perfmodel.fit(fit_rows, cfg.hardware.collective)
        forms["partial"].append(
            f"{perf.compute.form.name}/{perf.step.form.name if perf.step else '-'}"
        )
        held = [(p.workers, p.global_batch) for p in points if p not in corners]
        errs["partial"] += list(pct(step_of(perf, held), [truth[k] for k in held]))
        no_sweep = perfmodel.fit(fit_rows[fit_rows["source"] != "sweep"], cfg.hardware.collective)
        errs["partial_without_sweep"] += list(
            pct(step_of(no_sweep, held), [truth[k] for k in held])
        )
        own = [(p.workers, p.global_batch) for p in corners]
        meas = [
            pr[(pr["repeat"] == r) & (pr["workers"] == n) & (pr["global_batch"] == b)][
                "step_time_s"
            ].item()
            for n, b in own
        ]
        errs["partial_on_corners"] += list(pct(step_of(perf, own), meas))
        for p in points:
            perf = perfmodel.fit(
                pd.concat([mr[mr["job"] != p], mem_rows], ignore_index=True),
                cfg.hardware.collective,
            )
            forms["full"].append(
                f"{perf.compute.form.name}/{perf.step.form.name if perf.step else '-'}"
            )
            errs["full"] += list(
                pct(
                    step_of(perf, [(p.workers, p.global_batch)]),
                    [truth[(p.workers, p.global_batch)]],
                )
            )
    res = {
        "workload": {
            "model": cfg.workload.model,
            "dataset": cfg.workload.dataset,
            "points": len(points),
            "repeats": repeats,
            "max_local_batch": bmax,
            "sweep_rows_per_job": float((m["source"] == "sweep").sum() / (repeats * len(points))),
        },
        "noise_floor_pct": floor,
        "within_probe_step_cv_pct": float(100 * pr["step_time_cv"].median()),
        "errors": {k: summary(v) for k, v in errs.items()},
        "ratio_to_noise_floor": {k: summary(v)["median_pct"] / floor for k, v in errs.items()},
        "forms": {k: pd.Series(v).value_counts().to_dict() for k, v in forms.items()},
        "truth": [
            {"workers": n, "global_batch": b, "step_time_s": float(t)}
            for (n, b), t in truth.items()
        ],
    }
    return res


# -- (b) a synthetic GPU cluster ----------------------------------------------------------

D_SYN = 50_000  # CIFAR-10's training set
NOISE = 0.03  # timing: every measured mean
MEM_NOISE = 0.005  # memory: max_memory_allocated moves by allocator blocks, not by percent


class Cluster:
    """V100-like ground truth (none of Tula's forms): see the module docstring."""

    c0, b0 = 0.020, 64.0  # s at small b; under-used below ~64 samples
    alpha, grad_bytes, bandwidth = 50e-6, 100e6, 1.25e9  # 10 GbE, ResNet-50-sized gradient
    last_bucket = 0.25  # fraction of the sync after the backward ends (DDP's last bucket)
    mem0, mem1, budget = 2e9, 60e6, 32e9 * 0.9

    def compute(self, b):
        b = np.asarray(b, float)
        return self.c0 * (1 + (b / self.b0) ** 4) ** 0.25

    def sync(self, n):
        n = np.asarray(n, float)
        return np.where(
            n > 1,
            2 * (n - 1) * self.alpha + 2 * (n - 1) / n * self.grad_bytes / self.bandwidth,
            0.0,
        )

    def step(self, n, b):
        c, s = self.compute(b), self.sync(n)
        fwd, bwd = c / 3, 2 * c / 3
        return np.where(
            np.asarray(n) > 1,
            fwd + np.maximum(bwd, (1 - self.last_bucket) * s) + self.last_bucket * s,
            c,
        )

    def mem(self, b):
        return self.mem0 + self.mem1 * np.asarray(b, float)

    def bmax(self) -> int:
        return int((self.budget - self.mem0) // self.mem1)


def syn_config(batch_max: int = 8192, search: str = "partial") -> config_mod.Config:
    return config_mod.from_dict(
        {
            "grid": {"workers": [1, 2, 4, 8, 16], "batch_min": 32, "batch_max": batch_max},
            "search": search,
            "objective": "knee",
            "hardware": {"device_memory_gb": 32, "memory_margin": 0.1},
        }
    )


def noisy(x, rng):
    return float(x) * (1 + NOISE * rng.standard_normal())


def mem_noisy(x, rng):
    return float(x) * (1 + MEM_NOISE * rng.standard_normal())


def syn_memory_probe(
    cfg, cl: Cluster, rng, mem_noise: float = MEM_NOISE
) -> tuple[list[dict], int | None]:
    """Tula's memory probe on the cluster: its default batches, then its b_max check
    (next_probe_batch)."""
    from tula.model.memory import next_probe_batch, probe_batches

    def point(b):
        ok = cl.mem(b) <= 32e9
        return {
            "workers": 1,
            "global_batch": b,
            "local_batch": b,
            "status": "ok" if ok else "oom",
            "peak_mem_bytes": float(cl.mem(b)) * (1 + mem_noise * rng.standard_normal())
            if ok
            else None,
            "source": "memory",
        }

    pts = []
    for b in probe_batches(
        model_inputs.grid_spec(cfg), model_inputs.probe_steps(cfg).memory_batches
    ):
        pts.append(point(b))
        if pts[-1]["status"] != "ok":
            break
    while (
        b := next_probe_batch(
            model_inputs.grid_spec(cfg),
            model_inputs.probe_steps(cfg).memory_batches,
            cfg.hardware.memory_budget_bytes,
            pts,
        )
    ) is not None:
        pts.append(point(b))
    ok = [p for p in pts if p["status"] == "ok"]
    model = memory.from_points(
        ok, [p for p in pts if p["status"] == "oom"], cfg.hardware.memory_budget_bytes
    )
    return pts, model.max_local_batch()


def syn_job(cfg, cl: Cluster, p: Point, bmax, rng, sweep: bool = True) -> list[dict]:
    """The rows of one simulated probe job: its probe row and (with ``sweep``) its sweep rows."""
    b = p.local_batch
    if cl.mem(b) > 32e9:
        return [
            {
                "workers": p.workers,
                "global_batch": p.global_batch,
                "local_batch": b,
                "status": "oom",
                "source": "probe",
                "job": p,
            }
        ]
    comp, step = noisy(cl.compute(b), rng), noisy(cl.step(p.workers, b), rng)
    rows = [
        {
            "workers": p.workers,
            "global_batch": p.global_batch,
            "local_batch": b,
            "status": "ok",
            "source": "probe",
            "compute_time_s": comp,
            "step_time_s": step,
            "sync_time_s": max(step - comp, 0.0),
            "step_time_cv": NOISE,
            "peak_mem_bytes": mem_noisy(cl.mem(b), rng),
            "job": p,
        }
    ]
    if sweep:
        for lb in sweep_local_batches(model_inputs.grid_spec(cfg), p.workers, b, bmax, D_SYN // 4):
            if cl.mem(lb) > 32e9:
                rows.append(
                    {
                        "workers": p.workers,
                        "global_batch": p.global_batch,
                        "local_batch": lb,
                        "status": "oom",
                        "source": "sweep",
                        "job": p,
                    }
                )
                break
            rows.append(
                {
                    "workers": p.workers,
                    "global_batch": p.global_batch,
                    "local_batch": lb,
                    "status": "ok",
                    "source": "sweep",
                    "compute_time_s": noisy(cl.compute(lb), rng),
                    "peak_mem_bytes": mem_noisy(cl.mem(lb), rng),
                    "job": p,
                }
            )
    return rows


def syn_campaign(cfg, cl: Cluster, points, bmax, rng, sweep: bool = True) -> dict:
    """Each point's rows, as the workflow probes them: one job per N, whose first (smallest)
    point sweeps the compute curve for the whole job."""
    first = {
        n: min(p.global_batch for p in points if p.workers == n)
        for n in {p.workers for p in points}
    }
    return {
        p: syn_job(cfg, cl, p, bmax, rng, sweep and p.global_batch == first[p.workers])
        for p in sorted(points)
    }


def syn_fit(rows) -> perfmodel.PerfModel:
    return perfmodel.fit(pd.DataFrame(rows), "ring")


def feasible_points(cfg, cl: Cluster) -> list[Point]:
    return [p for p in grid(model_inputs.grid_spec(cfg)) if cl.mem(p.local_batch) <= cl.budget]


def part_b(seeds: int, full_seeds: int) -> dict:
    cl = Cluster()
    cfg = syn_config()
    errs: dict[str, list[float]] = {
        "partial_with_sweep": [],
        "partial_without_sweep": [],
        "full": [],
    }
    forms: dict[str, list[str]] = {k: [] for k in errs}
    feas = feasible_points(cfg, cl)
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        mrows, bmax = syn_memory_probe(cfg, cl, rng)
        corners = search_set(model_inputs.grid_spec(cfg), bmax)
        held = [p for p in feas if p not in corners]
        truth = cl.step([p.workers for p in held], [p.local_batch for p in held])
        for key, sweep in (("partial_with_sweep", True), ("partial_without_sweep", False)):
            jobs = syn_campaign(cfg, cl, corners, bmax, rng, sweep)
            perf = syn_fit(mrows + [r for rows in jobs.values() for r in rows])
            forms[key].append(f"{perf.compute.form.name}/{perf.step.form.name}")
            errs[key] += list(
                pct(step_of(perf, [(p.workers, p.global_batch) for p in held]), truth)
            )
    for seed in range(full_seeds):
        rng = np.random.default_rng(1000 + seed)
        mrows, bmax = syn_memory_probe(cfg, cl, rng)
        jobs = syn_campaign(
            cfg, cl, search_set(model_inputs.grid_spec(syn_config(search="full")), bmax), bmax, rng
        )
        for p in jobs:
            perf = syn_fit(mrows + [r for q, rows in jobs.items() if q != p for r in rows])
            forms["full"].append(f"{perf.compute.form.name}/{perf.step.form.name}")
            errs["full"] += list(
                pct(step_of(perf, [(p.workers, p.global_batch)]), cl.step(p.workers, p.local_batch))
            )
        print(f"[fidelity b] full search, seed {seed + 1}/{full_seeds}", flush=True)
    return {
        "cluster": {
            "workers": [1, 2, 4, 8, 16],
            "batch": [32, 8192],
            "b_max_true": cl.bmax(),
            "noise_pct": 100 * NOISE,
            "feasible_points": len(feas),
            "seeds_partial": seeds,
            "seeds_full": full_seeds,
        },
        "errors": {k: summary(v) for k, v in errs.items()},
        "forms": {k: pd.Series(v).value_counts().to_dict() for k, v in forms.items()},
    }


# -- (c) knee stability, (d) wasted probes ------------------------------------------------


def true_table(cfg, cl: Cluster) -> pd.DataFrame:
    pts = grid(model_inputs.grid_spec(cfg))
    df = pd.DataFrame(
        {"workers": [p.workers for p in pts], "global_batch": [p.global_batch for p in pts]}
    )
    df["local_batch"] = df["global_batch"] // df["workers"]
    df["step_time_s"] = cl.step(df["workers"], df["local_batch"])
    df["train_time_s"] = np.ceil(D_SYN / df["global_batch"]) * df["step_time_s"]
    df["cost"] = df["train_time_s"] * df["workers"]
    df["mem_bytes"] = cl.mem(df["local_batch"])
    df["feasible"] = df["mem_bytes"] <= cl.budget
    df["probe_status"] = ""
    return df


def part_c(seeds: int) -> dict:
    """Knee stability on two clusters, a smaller model's memory (10 MB a sample, b_max ~2700:
    the batch range, not memory, ends the curve): 100 Gb/s InfiniBand, where the knee lies
    inside every range, and (b)'s 10 GbE, where T still falls by more than 10 % a doubling
    up to B=8192, so a grid that stops at 4096 cuts the knee off."""
    out = {}
    for name, bandwidth in (("infiniband_100g", 12.5e9), ("ethernet_10g", 1.25e9)):
        cl = Cluster()
        cl.mem1, cl.bandwidth = 10e6, bandwidth
        out[name] = knee_runs(cl, seeds)
    return out


def knee_runs(cl: Cluster, seeds: int) -> dict:
    out: dict = {"per_batch_max": {}, "true_curve": {}}
    knees: dict[str, dict[int, list[int]]] = {"marginal": {}, "kneedle": {}}
    for bm in (4096, 8192, 16384):
        cfg = syn_config(bm)
        tt = true_table(cfg, cl)
        feas = tt[tt["feasible"]]
        t_min = float(feas["train_time_s"].min())
        best_t = feas.groupby("global_batch")["train_time_s"].min()
        true_sel = select(tt, model_inputs.planning(cfg)).knee
        out["true_curve"][bm] = {
            "marginal": true_sel["marginal"]["global_batch"],
            "kneedle": true_sel["kneedle"]["global_batch"],
        }
        rec: dict = {"marginal": [], "kneedle": []}
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            mrows, bmax = syn_memory_probe(cfg, cl, rng)
            jobs = syn_campaign(cfg, cl, search_set(model_inputs.grid_spec(cfg), bmax), bmax, rng)
            rows = mrows + [r for job in jobs.values() for r in job]
            perf = syn_fit(rows)
            mem = memory.fit(pd.DataFrame(rows), cfg.hardware.memory_budget_bytes)
            pred = predict(model_inputs.planning(cfg), perf, mem, D_SYN)
            k = select(pred, model_inputs.planning(cfg)).knee
            for rule in ("marginal", "kneedle"):
                b = k[rule]["global_batch"]
                if b is None:
                    rec[rule].append({"knee": None})
                    continue
                knees[rule].setdefault(seed, []).append(b)
                rec[rule].append({"knee": b, "true_T_over_min": float(best_t[b] / t_min)})
        out["per_batch_max"][bm] = {
            rule: {
                "knees": pd.Series([r["knee"] for r in v]).value_counts().to_dict(),
                "true_T_over_min_median": float(
                    np.median([r["true_T_over_min"] for r in v if r["knee"]])
                ),
                "true_T_over_min_max": float(
                    np.max([r["true_T_over_min"] for r in v if r["knee"]])
                ),
            }
            for rule, v in rec.items()
        }
    out["max_move_doublings"] = {
        rule: int(max((np.ptp(np.log2(v)) for v in d.values() if len(v) == 3), default=-1))
        for rule, d in knees.items()
    }
    return out


def part_d(seeds: int) -> dict:
    cl = Cluster()
    out = {}
    for workers in ([1, 2, 4, 8, 16], [2, 4, 8, 16]):
        cfg = config_mod.from_dict(
            {
                "grid": {"workers": workers, "batch_min": 32, "batch_max": 8192},
                "hardware": {"device_memory_gb": 32, "memory_margin": 0.1},
            }
        )
        old = search_set(model_inputs.grid_spec(cfg))
        wasted_old = sum(cl.mem(p.local_batch) > 32e9 for p in old)
        rec = {
            "old_corners": [p.name for p in old],
            "old_wasted": int(wasted_old),
            "new_corners_seed0": [
                p.name
                for p in search_set(
                    model_inputs.grid_spec(cfg),
                    syn_memory_probe(cfg, cl, np.random.default_rng(0))[1],
                )
            ],
        }
        for label, mem_noise in (("", MEM_NOISE), ("_mem_noise_3pct", 0.03)):
            wasted, extra = [], []
            for seed in range(seeds):
                pts, bmax = syn_memory_probe(cfg, cl, np.random.default_rng(seed), mem_noise)
                wasted.append(
                    sum(
                        cl.mem(p.local_batch) > 32e9
                        for p in search_set(model_inputs.grid_spec(cfg), bmax)
                    )
                )
                extra.append(len(pts) - 3)
            rec[f"new_wasted_max{label}"] = int(max(wasted))
            rec[f"memory_probe_extra_points_max{label}"] = int(max(extra))
        out[str(workers)] = rec
    return out


# -- (e) production vs prediction ---------------------------------------------------------


def part_e(finals: list[Path]) -> dict:
    rows = []
    for f in finals:
        if not f.exists():
            continue
        d = read_json(f)
        if d.get("predicted_step_time_s") is None:
            continue
        lo, hi = d.get("predicted_step_time_interval_s") or (None, None)
        rows.append(
            {
                "file": str(f),
                "workers": d["workers"],
                "global_batch": d["global_batch"],
                "predicted_step_time_s": d["predicted_step_time_s"],
                "measured_step_time_s": d["mean_step_time_s"],
                "interval_s": [lo, hi],
                "inside": lo is not None and lo <= d["mean_step_time_s"] <= hi,
                "ratio": d["step_time_ratio"],
            }
        )
    return {"runs": rows}


# -- plots --------------------------------------------------------------------------------


def plot_b(outdir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tula.figures import save_figure

    cl, cfg = Cluster(), syn_config()
    rng = np.random.default_rng(0)
    mrows, bmax = syn_memory_probe(cfg, cl, rng)
    corners = search_set(model_inputs.grid_spec(cfg), bmax)
    jobs = syn_campaign(cfg, cl, corners, bmax, rng)
    rows = mrows + [r for job in jobs.values() for r in job]
    perf = syn_fit(rows)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, n in enumerate(cfg.grid.workers):
        bs = np.array(
            [
                b
                for b in batch_sizes(model_inputs.grid_spec(cfg))
                if b // n >= 1 and cl.mem(b // n) <= cl.budget
            ],
            float,
        )
        c = colors[i % len(colors)]
        ax.plot(bs, cl.step(n, bs // n), "o", color=c, ms=4, label=f"N={n} truth")
        ax.plot(bs, perf.step_time_s(np.full_like(bs, n), bs // n), "-", color=c, alpha=0.7)
    for p in corners:
        ax.plot(p.global_batch, cl.step(p.workers, p.local_batch), "k*", ms=12)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("global batch B")
    ax.set_ylabel("step time (s)")
    ax.set_title("Synthetic V100 cluster: truth (dots), partial-search fit (lines), probes (stars)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, outdir / "fidelity_synthetic.png")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--parts", default="abcde")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--seeds", type=int, default=20, help="synthetic partial-search seeds (full: seeds / 10)"
    )
    ap.add_argument("--final", nargs="*", default=[str(ROOT / "results" / "train" / "final.json")])
    ap.add_argument("--out", default=str(ROOT / "results" / "fidelity"))
    a = ap.parse_args()
    out = Path(a.out)
    path = out / "fidelity.json"
    result = read_json(path) if path.exists() else {}
    t0 = time.perf_counter()
    if "a" in a.parts:
        result["a_this_machine"] = part_a(a.repeats, out)
    if "b" in a.parts:
        result["b_synthetic_gpu"] = part_b(a.seeds, max(a.seeds // 10, 1))
        plot_b(ROOT / "results" / "plots")
    if "c" in a.parts:
        result["c_knee_stability"] = part_c(a.seeds)
    if "d" in a.parts:
        result["d_wasted_probes"] = part_d(a.seeds)
    if "e" in a.parts:
        result["e_production"] = part_e([Path(f) for f in a.final])
    result["wall_s"] = time.perf_counter() - t0
    write_json(path, result)
    print(
        json.dumps(
            {k: v for k, v in result.items() if k != "a_this_machine"}
            | (
                {
                    "a_this_machine": {
                        k: v for k, v in result["a_this_machine"].items() if k != "truth"
                    }
                }
                if "a_this_machine" in result
                else {}
            ),
            indent=1,
            default=str,
        )
    )


if __name__ == "__main__":
    main()
