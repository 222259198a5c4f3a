"""``results/measurements.csv``: the input of ``tula fit``; one row per measurement.

This file is a public contract: measurements taken anywhere (a real GPU cluster, another
tool) can be written in this form and fed to ``tula fit`` / ``tula predict``.
Required columns (units in the names):

=================  ============================================================
workers            N, data-parallel workers (GPUs, or CPU processes) of the measuring job
global_batch       B, samples per optimizer step over all workers, of that job
local_batch        b, samples per worker per step (B / N for probe rows)
step_time_s        mean wall time of one synchronous training step (s)
compute_time_s     mean time of the same step without gradient sync (s)
sync_time_s        step_time_s - compute_time_s: exposed communication (s)
peak_mem_bytes     peak memory of one worker (bytes)
status             ok | oom | error | timeout; only ok rows are fitted
=================  ============================================================

Optional ``source`` says what a row is (absent: every row is a probe):

- ``probe``: a timed DDP probe at (N, B); every column above is filled (peak_mem_bytes
  but where peak_error says why not).
- ``sweep``: compute-only steps at another local batch, timed inside the probe job of
  (N, B) after its own measurement (the compute curve). local_batch is the swept one,
  global_batch the job's; step_time_s and sync_time_s are empty; compute_time_s and
  peak_mem_bytes are filled.
- ``memory``: the memory probe (one worker, before any timing probe): local_batch and
  peak_mem_bytes; the times are empty.

Other optional columns written by ``tula aggregate``: nodes (the nodes that job ran on: N /
cluster.workers_per_node, at least 1; absent, ``tula fit`` derives it so), step_time_iqr_s,
compute_time_iqr_s, step_time_cv, compute_time_cv, micro_time_s (on probe rows: the part of the
compute-only step its micro-batches took, their move to the device, forward and backward; the rest
is what a step pays once, accumulated or not), epoch_start_extra_s, partial_extra_s (the epoch's
short last batch's step less a full one; negative, it is cheaper), rss_peak_bytes, peak_error
(why a probe row's peak_mem_bytes is empty: torch's CPU profiler built no memory timeline in
PROFILER_TRIES tries; its timing stands, and the memory model fits the other rows),
grad_bytes_per_step, param_bytes, grad_bytes, opt_bytes, act_bytes, batch_bytes, train_samples,
wall_s, device, backend, comm_env (the NCCL_*/GLOO_* variables its workers ran with, ``K=V;K=V``),
error, probe_file; and on multi-worker probe rows the gradient noise scale (tula.model.noise):
grad_noise_scale = B_noise = grad_trace / grad_sq, grad_sq = |G|^2 and grad_trace = tr(Sigma), the
per-sample gradient covariance's trace, with grad_sq_se and grad_trace_se their standard errors over
the noise steps (empty for N = 1); and on probe rows input_time_s, the input pipeline's time per
batch read alone (no model; the slowest rank's), the floor of :mod:`tula.model.floor`, with
input_bound (it took at least INPUT_BOUND, 80 %, of the step) and data_workers (the loader processes
each worker read with). How precise each time is (:mod:`tula.runtime.timer.timing`):
step_time_halfwidth_rel and compute_time_halfwidth_rel, the 95 % confidence half-width of the mean
relative to it (sweep rows: compute only); step_timed_steps and compute_timed_steps, the plain steps
that mean is over, and step_judged_steps and compute_judged_steps, the steps the half-width is over
(with the epoch's starts and short last batches where it weighs them); precision_target
(probe.precision), precision_min_steps (probe.timed_steps: the judged steps each arm needs at
least), precision_reached (both within the target on at least that many steps) and timing_stopped_by
(precision | budget). ``tula fit`` weights each point by its half-width. The precision rule judges a
step that spikes by its robust spread (:mod:`tula.runtime.timer.precision`): step_spread (sd | mad)
and step_spikes (the steps that spiked) say so, and *_halfwidth_judged_rel are the half-widths it
judged (the fits weigh by the standard deviation's). On a device with a queue (CUDA):
step_host_share, the host's time to queue a step over its time between the step's events, both
taken on steps queued onto a drained device (a full launch queue holds a host to its device's pace:
:mod:`tula.runtime.timer.timing`), and host_bound (at least HOST_BOUND, 90 %: the device waited for
Python). Where data.decode auto had two decoders to choose from (JPEGs on CUDA,
:mod:`tula.runtime.input.decoding`): decode, the one the probe measured faster and read with (cpu |
gpu), and decode_faster_by. On memory rows, where tula check estimated the step from the model alone
(:mod:`tula.model.estimated`): estimate_mem_bytes, the estimate's peak at that local batch, and
estimate_mem_error, its relative error against the measured peak ((estimate - measured) / measured).
On probe rows, what the probe job spent timing: timed_s, the seconds of its timed steps (synced,
compute-only, with the epoch starts and short last batches each arm timed, and its sweep's, each a
mean x its steps), and probe_efficiency = timed_s / wall_s, the share of the probe's wall that
bought a measurement; the rest is start-up, first steps, evaluation and checkpoints (the report sums
it over the campaign). One job probes every batch of an N in one process: wall_s is the point's own
time in it plus an equal share of what the job paid once (its start-up, its process group), so a
job's points sum to job_wall_s, the job's wall (its workers' start to end); fresh_process says
whether the point's first steps were the process's own (the job's first point: what a production job
pays at its start), and only those give the first step's extra its prediction
(:func:`tula.model.predictions.one_off_extras`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

# a step is input-bound where its input alone takes at least this share of it (the probe's
# input_bound; the floor, tula.model.floor, is where the fitted input time reaches it)
INPUT_BOUND = 0.8
# a step is host-bound where the host's time to queue it is at least this share of its time on
# the device between its CUDA events (the probe's step_host_share; the device waited for Python)
HOST_BOUND = 0.9


def host_bound(share):
    """Whether the host set the pace: its share of the step's device time spent queuing it is
    at least HOST_BOUND (a scalar or a Series of step_host_share)."""
    return share >= HOST_BOUND


# results/partitions/<name>/probes/N{n}/job.json: what the probe job at N measured (its records
# beside it)
PROBE_JOB_SCHEMA = "tula.probe-job/1"

REQUIRED = [
    "workers",
    "global_batch",
    "local_batch",
    "step_time_s",
    "compute_time_s",
    "sync_time_s",
    "peak_mem_bytes",
    "status",
]
OPTIONAL = [
    "source",
    "step_host_share",
    "host_bound",
    "step_spread",
    "step_spikes",
    "decode",
    "decode_faster_by",
    "step_time_halfwidth_judged_rel",
    "compute_time_halfwidth_judged_rel",
    "first_short_step_s",
    "partial_extra_s",
    "nodes",
    "step_time_iqr_s",
    "compute_time_iqr_s",
    "step_time_cv",
    "compute_time_cv",
    "epoch_start_extra_s",
    "rss_peak_bytes",
    "peak_error",
    "grad_bytes_per_step",
    "param_bytes",
    "grad_bytes",
    "opt_bytes",
    "act_bytes",
    "batch_bytes",
    "train_samples",
    "wall_s",
    "device",
    "backend",
    "comm_env",
    "hosts",
    "error",
    "probe_file",
    "grad_noise_scale",
    "grad_sq",
    "grad_trace",
    "grad_sq_se",
    "grad_trace_se",
    "startup_time_s",
    "eval_first_time_s",
    "eval_time_s",
    "checkpoint_time_s",
    "first_steps_time_s",
    "block_steps",
    "input_time_s",
    "input_bound",
    "data_workers",
    "step_time_halfwidth_rel",
    "compute_time_halfwidth_rel",
    "step_timed_steps",
    "compute_timed_steps",
    "step_judged_steps",
    "compute_judged_steps",
    "precision_target",
    "precision_min_steps",
    "precision_reached",
    "timing_stopped_by",
    "estimate_mem_bytes",
    "estimate_mem_error",
    "timed_s",
    "probe_efficiency",
    "job_wall_s",
    "fresh_process",
    "accumulate",
    "micro_time_s",
]
NUMERIC = [c for c in REQUIRED if c != "status"]
SOURCES = ("probe", "sweep", "memory")
# The numbers an ok row of each source must carry.
FILLED = {
    "probe": NUMERIC,
    "sweep": ["workers", "global_batch", "local_batch", "compute_time_s"],
    "memory": ["workers", "global_batch", "local_batch", "peak_mem_bytes"],
}


def judged_halfwidths(row: pd.Series) -> tuple[list[float | None], bool]:
    """A probe or sweep row's half-widths (step, compute; a sweep's step is None) as the
    precision rule judged them: from the robust spread where a few steps spiked, and whether
    it was that."""
    probe = row["source"] == "probe"
    robust = probe and row.get("step_spread") == "mad" and "step_time_halfwidth_judged_rel" in row
    judged = "_judged" if robust else ""
    hws = [
        row.get(f"step_time_halfwidth{judged}_rel") if probe else None,
        row.get(f"compute_time_halfwidth{judged}_rel"),
    ]
    return [float(h) if pd.notna(h) else None for h in hws], bool(robust)


def judged_steps(row: pd.Series) -> float:
    """The steps a probe row's synced half-width is over (step_judged_steps: every kind its
    mean weighs); its plain steps where the row predates the column."""
    steps = pd.to_numeric(row.get("step_judged_steps"), errors="coerce")
    return steps if pd.notna(steps) else pd.to_numeric(row.get("step_timed_steps"), errors="coerce")


def short_of_steps(row: pd.Series) -> int | None:
    """probe.timed_steps (precision_min_steps) where a probe row's half-width is over fewer
    steps than that (:func:`judged_steps`): it cannot have reached its precision, whatever its
    half-widths (the budget ran out first). None otherwise, or where the row does not say."""
    least = pd.to_numeric(row.get("precision_min_steps"), errors="coerce")
    steps = judged_steps(row)
    return int(least) if least == least and steps == steps and steps < least else None


# a production job whose final test accuracy is at most this multiple of chance (1 / classes)
# learned nothing the test set asks: said in the report and the summary
AT_CHANCE = 1.5


def at_chance(final: dict, num_classes: int | None) -> str | None:
    """What the report and the summary say where the production job's final test accuracy is
    at chance for its classes (at most AT_CHANCE x 1 / classes), else None (always None for a
    metric other than accuracy). A job that trained
    at the planned speed but learned nothing is not a result: an H200 run at 9.2 % on 10
    classes (BatchNorm statistics of twice-standardised batches) said only its number."""
    acc = final.get("final_test_acc")
    if final.get("metric", "accuracy") != "accuracy":
        return None  # another metric has no chance level Tula knows
    if not num_classes or num_classes < 2 or acc is None or acc > AT_CHANCE / num_classes:
        return None
    return (
        f"The final test accuracy, {100 * acc:.2f} %, is at chance for {num_classes} classes "
        f"({100 / num_classes:.0f} %; best {100 * final.get('best_test_acc', acc):.2f} %), "
        f"with the training loss at {final.get('final_train_loss', float('nan')):.3g}: the "
        "model did not learn what the test set asks. The training plot tells which: a test loss "
        "far above the training loss points at the data (train and test prepared alike?) or "
        "BatchNorm's statistics; a training loss that never fell, at train.lr or the epochs."
    )


def load(path: str | Path) -> pd.DataFrame:
    """Read and check a measurements table; errors name the file, the row and the column.
    A table without ``source`` is all probe rows."""
    p = Path(path)
    try:
        df = pd.read_csv(p)
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: measurements file not found") from None
    except pd.errors.EmptyDataError:
        raise ValueError(f"{p}: empty file; expected columns {', '.join(REQUIRED)}") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(
            f"{p}: missing column(s) {', '.join(missing)}; required: {', '.join(REQUIRED)}"
        )
    if "source" not in df.columns:
        df["source"] = "probe"
    df["source"] = df["source"].fillna("probe").astype(str)
    if not df["source"].isin(SOURCES).all():
        i = int((~df["source"].isin(SOURCES)).idxmax())
        raise ValueError(
            f"{p}: row {i + 2}, column source: {df['source'][i]!r} is not one of "
            f"{', '.join(SOURCES)}"
        )
    ok = df["status"] == "ok"
    for c in NUMERIC:
        vals = pd.to_numeric(df[c], errors="coerce")
        needed = np.zeros(len(df), dtype=bool)
        for src, cols in FILLED.items():
            if c in cols:
                needed |= (df["source"] == src).to_numpy()
        if c == "peak_mem_bytes" and "peak_error" in df.columns:  # why a probe has none
            needed &= df["peak_error"].isna().to_numpy()
        bad = ok & ((vals.isna() & needed) | (vals < 0))
        if bad.any():
            i = int(bad.idxmax())
            v = df.at[i, c]
            shown = repr(v) if isinstance(v, str) else str(v)  # a word quoted, a number as written
            raise ValueError(f"{p}: row {i + 2}, column {c}: {shown} is not a non-negative number")
        df[c] = vals
    bad_div = (
        ok & (df["source"] == "probe") & (df["local_batch"] * df["workers"] != df["global_batch"])
    )
    if bad_div.any():
        i = int(bad_div.idxmax())
        raise ValueError(f"{p}: row {i + 2}: local_batch x workers != global_batch")
    return df


def probes(df: pd.DataFrame) -> pd.DataFrame:
    """The timed DDP probe rows (not the sweep or memory rows)."""
    return df[df["source"] == "probe"] if "source" in df.columns else df


def accumulated(df: pd.DataFrame) -> pd.Series:
    """k, the micro-batches each row's step ran as (``train.accumulate``; 1: one batch)."""
    if "accumulate" not in df.columns:
        return pd.Series(1, index=df.index)
    return pd.to_numeric(df["accumulate"], errors="coerce").fillna(1).astype(int)


def once_per_step(df: pd.DataFrame) -> tuple[tuple[float, float], ...]:
    """(N, seconds) pairs, by N: what a one-batch compute-only step pays once whatever its
    micro-batches (compute_time_s less micro_time_s, the median of the one-batch probe rows
    that measured both; of every probe row at an N that has none)."""
    if "micro_time_s" not in df.columns:
        return ()
    rows = probes(df)
    once = pd.to_numeric(rows["compute_time_s"], errors="coerce") - pd.to_numeric(
        rows["micro_time_s"], errors="coerce"
    )
    ok = np.isfinite(once)
    one = ok & (accumulated(rows) == 1)
    at_n = rows["workers"].where(ok)
    ok &= one | ~at_n.isin(rows["workers"][one])  # one-batch rows where an N has them
    by_n = once[ok].clip(lower=0.0).groupby(rows["workers"][ok]).median()
    return tuple((float(n), float(s)) for n, s in sorted(by_n.items()))


def once_at(once: tuple[tuple[float, float], ...], workers) -> np.ndarray:
    """What a step pays once at each N (:func:`once_per_step`'s pairs; the nearest measured N's,
    interpolated between); 0 where not measured."""
    n = np.asarray(workers, dtype=float)
    if not once:
        return np.zeros_like(n)
    at, s = zip(*once)
    return np.interp(n, at, s)


def as_micro_batches(df: pd.DataFrame, once: tuple[tuple[float, float], ...] = ()) -> pd.DataFrame:
    """Each row as the one-batch step the step model fits: a step measured as k micro-batches
    of b / k becomes a step at b / k that pays ``once`` (:func:`once_per_step`) and one k-th of
    the rest of its compute c, c' = o + (c - o) / k; its step s - (c - c') (the same sync), its
    input i / k. So the step model's price of the row,
    :meth:`tula.model.perf.PerfModel.accumulated`'s c' + (k - 1) (c' - o) and the sync, is
    what the row measured. Without ``once`` (micro-batches not timed): c / k."""
    k = accumulated(df)
    if (k == 1).all():
        return df
    out = df.copy()
    kf = k.astype(float)
    c = pd.to_numeric(out["compute_time_s"], errors="coerce")
    o = np.minimum(once_at(once, out["workers"]), c)
    fewer = (kf - 1) * (c - o) / kf  # the micro-batches a one-batch step does not run
    out["local_batch"] = out["local_batch"] / kf
    out["compute_time_s"] = c - fewer
    out["step_time_s"] = pd.to_numeric(out["step_time_s"], errors="coerce") - fewer
    if "input_time_s" in out.columns:
        out["input_time_s"] = pd.to_numeric(out["input_time_s"], errors="coerce") / kf
    return out


def memory_batch(df: pd.DataFrame) -> pd.Series:
    """The batch each row's memory peak was measured at: its local batch, or an accumulated
    row's micro-batch, ceil(b / k)."""
    return -(-df["local_batch"].astype(int) // accumulated(df))


def comm_env_text(env: dict) -> str:
    """A worker's communication variables as one CSV cell, ``K=V;K=V`` (empty: none set)."""
    return ";".join(f"{k}={v}" for k, v in sorted((env.get("comm_env") or {}).items()))
