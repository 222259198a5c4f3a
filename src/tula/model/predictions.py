"""Every grid point's prediction, probed or not: step time with its interval, T (Eq. 4a),
C (Eq. 4b), memory, feasibility, the job's wall time besides its steps, and the time to the
same accuracy. One frame, ``results/predictions.csv``'s rows (:mod:`tula.stages.predict`
writes it; the choice's resamples, :mod:`tula.model.robust`, rebuild it)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from tula.model import measurements as measurements_mod
from tula.model import noise
from tula.model import pricing as pricing_mod
from tula.model.grid import grid, micro_steps, nodes_of, short_last_batch, steps_per_epoch
from tula.model.inputs import JobExtras, Planning, Price
from tula.model.memory import MemoryModel
from tula.model.perf import PerfModel, evaluation_time


def _costs(df: pd.DataFrame, price: Price) -> dict[str, object]:
    """Each pricing model's cost of training at every point (Eq. 4b), and the configured one."""
    t, n = df["train_time_s"], df["workers"]
    cols = {
        "cost_worker_hour": pricing_mod.worker_cost(t, n, price.per_worker_hour),
        "cost_node_hour": (
            math.nan
            if price.per_node_hour is None
            else pricing_mod.node_cost(t, n, price.workers_per_node, price.per_node_hour)
        ),
        "cost_memory": pricing_mod.memory_cost(t, n, df["mem_bytes"], price.per_gb_hour),
    }
    return {**cols, "cost": cols[f"cost_{price.model}"]}


def _probed(df: pd.DataFrame, measured: pd.DataFrame | None) -> pd.DataFrame:
    """Each point's probe: its status and measured step (and T), and ``oom``: a probe ran out
    of memory there (the point is then no candidate)."""
    status, step, train, oom = [""] * len(df), [math.nan] * len(df), [math.nan] * len(df), []
    m = (
        measurements_mod.probes(measured).set_index(["workers", "global_batch"])
        if measured is not None and len(measured)
        else None
    )
    for i, row in enumerate(df.itertuples(index=False)):
        key = (row.workers, row.global_batch)
        rec = m.loc[key] if m is not None and key in m.index else None
        rec = rec.iloc[0] if isinstance(rec, pd.DataFrame) else rec
        if rec is not None:
            status[i] = rec["status"]
            if rec["status"] == "ok":
                step[i] = rec["step_time_s"]
                train[i] = row.epochs * row.steps_per_epoch * rec["step_time_s"]
        oom.append(rec is not None and rec["status"] == "oom")
    return pd.DataFrame(
        {
            "probe_status": status,
            "measured_step_time_s": step,
            "measured_train_time_s": train,
            "oom": oom,
        },
        index=df.index,
    )


def _steps(plan: Planning, perf: PerfModel, mem: MemoryModel, train_samples: int) -> pd.DataFrame:
    """The grid's points with their predicted step (Eq. 2, with its 95 % interval), T (Eq. 4a)
    and memory (Eq. 3); ``accumulate``: the micro-batches k a step runs as
    (``train.accumulate``, :func:`tula.model.grid.micro_steps` at the memory model's b_max),
    priced by :meth:`PerfModel.accumulated`, its memory its micro-batch's."""
    pts = grid(plan.grid)
    workers = np.array([p.workers for p in pts], dtype=int)
    batch = np.array([p.global_batch for p in pts], dtype=int)
    n, b = workers.astype(float), (batch // workers).astype(float)
    k = micro_steps(batch // workers, plan.grid.accumulate, mem.max_local_batch())
    step = perf.accumulated(n, b, k)
    if perf.input is None:
        step["input_time_s"] = math.nan
    spe = steps_per_epoch(train_samples, batch, workers)
    df = pd.DataFrame(
        {
            "workers": workers,
            "nodes": nodes_of(workers, plan.grid.workers_per_node).astype(int),
            "global_batch": batch,
            "local_batch": batch // workers,
            "accumulate": k,
            "micro_batch": -(-(batch // workers) // k),
            **{c: step[c] for c in ("compute_time_s", "step_time_s", "sync_time_s")},
            **{c: step[c] for c in ("input_time_s", "input_bound")},
            "step_time_lo_s": step["step_time_lo_s"],
            "step_time_hi_s": step["step_time_hi_s"],
            "steps_per_epoch": spe,
            "epochs": plan.goal.epochs,
        }
    )
    steps = df["epochs"] * df["steps_per_epoch"]
    return df.assign(
        train_time_s=steps * df["step_time_s"],
        train_time_lo_s=steps * df["step_time_lo_s"],
        train_time_hi_s=steps * df["step_time_hi_s"],
        mem_bytes=mem.predict_bytes(df["micro_batch"]),
    )


def predict(
    plan: Planning,
    perf: PerfModel,
    mem: MemoryModel,
    train_samples: int,
    measured: pd.DataFrame | None = None,
    wall: bool = True,
) -> pd.DataFrame:
    """One row per grid point: predicted step time (with its 95 % interval), T, C, memory,
    feasibility, and the probe's measurement where there was one. Each group of columns is
    built from the ones before it; none is filled in place. ``wall``: with the job's wall
    time besides its steps (:func:`_wall_time`), which no objective reads: the choice's
    resamples (:mod:`tula.model.robust`) leave it out."""
    df = _steps(plan, perf, mem, train_samples)
    df = df.assign(**_costs(df, plan.price))
    # N > 1 without any measured sync (probe.no_sync_fallback): not a candidate, never "free"
    # communication
    sync_measured = (df["workers"] == 1) | (perf.step is not None)
    probed = _probed(df, measured)
    df = df.assign(
        feasible=np.asarray(mem.feasible(df["micro_batch"]), dtype=bool)
        & sync_measured.to_numpy()
        & ~probed["oom"].to_numpy(bool),
        sync_measured=sync_measured,
        **probed.drop(columns="oom"),
    )
    if wall:
        df = df.assign(**_wall_time(df, plan.extras, measured))
    nz = noise.pool(measured) if measured is not None else None
    return df.assign(**_time_to_accuracy(df, plan, nz))


OVERHEADS = ("startup_time_s", "eval_first_time_s", "eval_time_s", "checkpoint_time_s")
WALL = ("wall_time_s", "wall_time_lo_s", "wall_time_hi_s")


def checkpoints_written(
    epochs: int, steps_per_epoch: int, every_steps: int | None, every_epochs: int | None
) -> int:
    """The checkpoints a run that is never stopped writes: every k-th step, at the end of
    every k-th epoch but the last, and the final one (as tula.production.trainer does)."""
    steps = epochs * steps_per_epoch
    return (
        (steps // every_steps if every_steps else 0)
        + ((epochs - 1) // every_epochs if every_epochs else 0)
        + 1
    )


def _wall_time(
    df: pd.DataFrame, extras: JobExtras, measured: pd.DataFrame | None
) -> dict[str, object]:
    """What the job pays besides its steps, beside T: start-up, one evaluation pass per
    epoch (the first, cold, apart) and each checkpoint write, as the probes measured them
    (their median at the same N; at an N not probed, the nearest probed N's, its evaluation
    scaled by N0/N, as the test set is sharded over the workers). ``wall_time_s`` = start-up
    + T + what the first step at each shape pays beyond T's rate (:func:`first_steps`) +
    first pass + (E - 1) x later pass + checkpoints x write; NaN where no probe measured them
    (records from before they did)."""
    every = (extras.checkpoint_every_steps, extras.checkpoint_every_epochs)
    out: dict[str, object] = {
        "checkpoints": [
            checkpoints_written(int(e), int(s), *every)
            for e, s in zip(df["epochs"], df["steps_per_epoch"])
        ]
    }
    probes = measurements_mod.probes(measured) if measured is not None and len(measured) else None
    ok = None
    if probes is not None:
        ok = probes[probes["status"] == "ok"]
        ok = ok[[c for c in ("workers", *OVERHEADS) if c in ok.columns]].dropna()
    if ok is None or ok.empty or len(ok.columns) < 1 + len(OVERHEADS):
        return {**out, **dict.fromkeys(OVERHEADS + WALL, math.nan)}
    per_n = ok.groupby("workers")[list(OVERHEADS)].median()
    probed = per_n.index.to_numpy()
    n = df["workers"].to_numpy()
    # the nearest probed N of each row
    n0 = probed[abs(probed[None, :] - n[:, None]).argmin(axis=1)]
    near = per_n.loc[n0]
    # a new batch shape builds its own kernels where the step is compiled or runs on a GPU
    # (cuDNN's autotuning); on a CPU in eager mode it reuses what the first step built
    devices = probes["device"].dropna().astype(str) if "device" in probes.columns else []
    builds = extras.compiled or any(not d.startswith("cpu") for d in devices)
    first_s, first_n = first_steps(df, probes, n0, builds)
    paid = df.assign(
        **out,
        startup_time_s=near["startup_time_s"].to_numpy(),
        first_steps_time_s=first_s,
        first_steps=first_n,
        eval_first_time_s=near["eval_first_time_s"].to_numpy() * n0 / n,
        eval_time_s=near["eval_time_s"].to_numpy() * n0 / n,
        checkpoint_time_s=near["checkpoint_time_s"].to_numpy(),
    )
    # T counts every step at the step's rate: the first steps add only what they pay beyond it
    besides = (
        paid["startup_time_s"]
        + paid["first_steps_time_s"]
        - paid["first_steps"] * paid["step_time_s"]
        + evaluation_time(paid)
        + paid["checkpoints"] * paid["checkpoint_time_s"]
    )
    return {
        **{c: paid[c] for c in paid.columns if c not in df.columns},
        "wall_time_s": paid["train_time_s"] + besides,
        "wall_time_lo_s": paid["train_time_lo_s"] + besides,
        "wall_time_hi_s": paid["train_time_hi_s"] + besides,
    }


def shapes_apart(train_samples: int, global_batch: int, workers: int) -> int:
    """Steps a job pays apart at its start: the first full batch, and the first short last
    batch where its epoch ends in one that is trained (:func:`tula.model.grid.short_last_batch`);
    one where the whole epoch is one batch (B >= D)."""
    if global_batch >= train_samples:
        return 1
    return 1 + int(short_last_batch(train_samples, global_batch, workers))


def first_steps(
    df: pd.DataFrame, probes: pd.DataFrame, n0, builds_per_shape: bool = False
) -> tuple[list[float], list[int]]:
    """What each point's job pays for its first step at each batch shape, and how many such
    steps: its own predicted step (``df["step_time_s"]``) at each, plus what the probes at its
    nearest probed N (``n0``) paid once beyond their steps (:func:`one_off_extras`), read at
    its B between the probes' (linear in log B, the end probes' beyond them): the process's
    first step's extra (the loader's first batches, the allocator's growth, DDP's first
    buckets, compilation, cuDNN's autotuning) and, where the point's epoch ends in a short
    batch, that new shape's. Records without the short batch's split give the probes' median
    ``first_steps_time_s`` at that N."""
    ok = probes[probes["status"] == "ok"] if "status" in probes.columns else probes
    train = ok["train_samples"].dropna() if "train_samples" in ok.columns else pd.Series()
    d = int(train.iloc[0]) if len(train) else None
    counts = (
        [shapes_apart(d, int(b), int(n)) for n, b in zip(df["workers"], df["global_batch"])]
        if d is not None
        else [1] * len(df)
    )
    if "first_steps_time_s" not in ok.columns or ok.empty:  # not measured: none predicted
        return [0.0] * len(df), [0] * len(df)
    if "first_short_step_s" not in ok.columns or ok["first_short_step_s"].isna().all():
        med = ok.groupby("workers")["first_steps_time_s"].median()
        return med.reindex(n0).fillna(0.0).tolist(), counts
    first, short = one_off_extras(ok, d)
    out = []
    batch = ok["global_batch"]
    at_n = {at: ok["workers"] == at for at in set(n0)}
    firsts = {at: _per_batch(first[h], batch[h]) for at, h in at_n.items()}
    shorts = {at: _per_batch(short[h], batch[h]) for at, h in at_n.items()}
    for k, b, at, t in zip(counts, df["global_batch"], n0, df["step_time_s"]):
        full_x = _at_batch(firsts[at], b)
        out.append(k * float(t) + (full_x or 0.0))
        if k > 1:
            # a new shape's own cost: measured at this N, else at any, else (nothing measured
            # it) the first step's where each shape builds its own kernels, none where it does not
            short_x = _at_batch(shorts[at], b)
            if short_x is None:
                short_x = _at_batch(_per_batch(short, batch), b)
            if short_x is None:
                short_x = (full_x or 0.0) if builds_per_shape else 0.0
            out[-1] += (k - 1) * short_x
    return out, counts


def one_off_extras(ok: pd.DataFrame, train_samples: int | None) -> tuple[pd.Series, pd.Series]:
    """Per probe, what its first steps paid beyond the same steps later: the first step's
    extra (``first_steps_time_s`` less the short batch's first step and its own step; where the
    epoch is one batch, B >= D, its two steps are that one shape's, less two steps), and the
    short last batch's first step's extra over that batch's own step (``partial_extra_s`` off
    the step; NaN where the probe's epoch has no short batch of its own). Never below zero."""
    step = ok["step_time_s"]
    short_s = ok["first_short_step_s"].fillna(0.0)
    whole = (
        ok["global_batch"] >= train_samples
        if train_samples is not None
        else pd.Series(False, index=ok.index)
    )
    first = (ok["first_steps_time_s"] - short_s - step).where(
        ~whole, ok["first_steps_time_s"] - 2 * step
    )
    if "fresh_process" in ok.columns:  # a later point of a probe job: the process was warm
        first = first.where(ok["fresh_process"].map(lambda v: str(v) != "False").astype(bool))
    partial = ok["partial_extra_s"].fillna(0.0) if "partial_extra_s" in ok.columns else 0.0
    short = (short_s - (step + partial)).where((short_s > 0) & ~whole)
    return first.clip(lower=0.0), short.clip(lower=0.0)


def _per_batch(extra: pd.Series, batch: pd.Series) -> pd.Series:
    """``extra`` (one value per probe at global batch ``batch``): its median at each probed B."""
    return extra.groupby(batch).median().dropna()


def _at_batch(per_b: pd.Series, b: int) -> float | None:
    """A :func:`_per_batch` curve read at ``b``: linear in log B between the probed B's, the
    nearest's beyond them; None where it has none."""
    if per_b.empty:
        return None
    return float(np.interp(math.log2(b), np.log2(per_b.index.to_numpy(float)), per_b.to_numpy()))


def _time_to_accuracy(df: pd.DataFrame, plan: Planning, nz: dict | None) -> dict[str, object]:
    """Time and cost to the accuracy that ``workload.epochs`` reach at ``train.base_batch``
    (McCandlish et al. 2018): reaching a given loss takes E = E_min (1 + B / B_noise) samples,
    so at batch B the epochs scale by (1 + B / B_noise) / (1 + base_batch / B_noise).
    B_noise is pooled from the probes (tula.model.noise.pool); NaN columns without it."""
    cols = ("b_noise", "b_noise_se", "epochs_to_accuracy", "time_to_accuracy_s", "cost_to_accuracy")
    if nz is None:
        return dict.fromkeys(cols, math.nan)
    bn, g = nz["b_noise"], plan.goal
    epochs = noise.epochs_to_accuracy(g.epochs, df["global_batch"], g.base_batch, bn)
    time_s = epochs * df["steps_per_epoch"] * df["step_time_s"]
    return {
        "b_noise": bn,
        "b_noise_se": nz["b_noise_se"],
        "epochs_to_accuracy": epochs,
        "time_to_accuracy_s": time_s,
        "cost_to_accuracy": pricing_mod.cost(time_s, df["workers"], df["mem_bytes"], plan.price),
    }
