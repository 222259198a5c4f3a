"""Rank 0's measurement at a probe's point (:mod:`tula.runtime.probe.probe_worker`), a
:class:`tula.model.probe_measured.Measurement`: the step, compute and sync times from every
rank's timed steps (each step the slowest rank's), an epoch start's, a mid-epoch refresh's and
the short last batch's extra at training's rate, the timing's precision, the memory peaks, the
input pipeline alone, the host's share of a queued step and the decoder ``data.decode: auto``
measured faster."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tula.model.measurements import INPUT_BOUND, host_bound
from tula.model.probe_measured import Measurement
from tula.runtime.probe.measure import timing_stats
from tula.runtime.timer.timing import Timing

if TYPE_CHECKING:  # Stepped.of reads a replica; a user's script never builds one
    from tula.runtime.step.replica import Replica


@dataclass(frozen=True)
class Stepped:
    """What the measurement needs of the steps' own loop: Tula's replica
    (:meth:`of`), or a user's script (:mod:`tula.script.probe`)."""

    steps_per_epoch: int
    refreshes_per_step: float  # mid-epoch AGS refreshes per step
    train_samples: int | None
    steps_run: int
    compile: str | None = None
    on_device: bool | None = None
    decode: dict | None = None
    optimizer_counters: dict[str, int] | None = None

    @classmethod
    def of(cls, replica: Replica) -> Stepped:
        return cls(
            steps_per_epoch=replica.steps_per_epoch,
            refreshes_per_step=replica.cadence.midepoch_refreshes_per_step(),
            train_samples=replica.data.train_size,
            steps_run=replica.steps_done,
            compile=replica.compile,
            on_device=replica.on_device,
            decode=replica.decode,
            optimizer_counters=replica.update.ags_counters(),
        )


def measurement(
    stepped: Stepped,
    gathered: list[dict],
    timing: Timing,
    extras: dict[str, Any],
    **more: Any,
) -> Measurement:
    """Rank 0: the probe's step, compute and sync times (per step, the slowest rank's), with an
    epoch start's and a mid-epoch refresh's extra cost, and the short last batch's saving,
    added at training's rate; the timing's precision; its peak memory, the largest rank's;
    ``more``: the rest of the measurement, as :class:`Measurement` names it (memory, env)."""
    step, comp = timing.arms["step"], timing.arms["compute"]
    for arm in (step, comp):  # every step an epoch's first (B >= D): those, then
        arm.fall_back_to_starts()
    s, c = timing_stats(step.times), timing_stats(comp.times)
    s["mean"], c["mean"] = step.mean(), comp.mean()
    start_extra = max(_over(extras["start"], s["mean"]), 0.0)
    refresh_extra = max(_over(extras["refresh"], s["mean"]), 0.0)
    # the epoch's short last batch, cheaper than a full one (negative), once an epoch
    partial_extra = _over(extras["partial"], s["mean"])
    extra = (
        start_extra + partial_extra
    ) / stepped.steps_per_epoch + refresh_extra * stepped.refreshes_per_step
    return Measurement(
        step_time_s=s["mean"] + extra,
        compute_time_s=c["mean"] + extra,
        micro_time_s=extras.get("micro"),
        sync_time_s=max(s["mean"] - c["mean"], 0.0),
        epoch_start_extra_s=start_extra,
        refresh_extra_s=refresh_extra,
        partial_extra_s=partial_extra,
        partial_step_times_s=extras["partial"],
        steps_per_epoch=stepped.steps_per_epoch,
        epoch_start_step_times_s=extras["start"],
        refresh_step_times_s=extras["refresh"],
        lead_in_steps=extras.get("lead_in", {}),  # untimed, by kind (StepTimer.run)
        step_time_median_s=s["median"],
        compute_time_median_s=c["median"],
        step_time_iqr_s=s["iqr"],
        compute_time_iqr_s=c["iqr"],
        step_time_cv=s["cv"],
        compute_time_cv=c["cv"],
        step_times_s=step.times,
        compute_times_s=comp.times,
        timing=timing.figures(),
        **_peaks(gathered),
        train_samples=stepped.train_samples,
        first_steps_time_s=max(g.get("first_steps", 0.0) for g in gathered),
        first_short_step_s=max(g.get("first_short_step", 0.0) for g in gathered),
        compile=stepped.compile,
        on_device=stepped.on_device,
        **_decode(stepped.decode),
        **_input(gathered, s["mean"] + extra),
        host_bound=_host_bound(timing),
        steps_run=stepped.steps_run,
        optimizer_counters=stepped.optimizer_counters,
        **more,
    )


def _over(times: list[float], mean: float) -> float:
    """How much longer steps of one kind took than the plain mean (0 where none was timed)."""
    return statistics.fmean(times) - mean if times else 0.0


def _decode(choice: dict | None) -> dict[str, Any]:
    """data.decode auto, where it was measured (tula.runtime.input.decoding): which decoder the
    probe read with, by how much it was faster, and both timings."""
    if choice is None:
        return {"decode": None, "decode_faster_by": None, "decode_choice": None}
    return {
        "decode": choice["chosen"],
        "decode_faster_by": choice["faster_by"],
        "decode_choice": choice,
    }


def _host_bound(timing: Timing) -> bool | None:
    """On a queued device: did the host's time to queue the synced step set its pace (None
    where the clock has no queue to tell it by)."""
    share = timing.arms["step"].host_share()
    return None if share is None else bool(host_bound(share))


def _peaks(gathered: list[dict]) -> dict[str, Any]:
    """The probe's memory peaks, each the largest rank's; none where torch's profiler failed
    every try (the ranks agree on it), and why (``peak_error``)."""
    rss = int(max(g["rss"] for g in gathered))
    why = next((g["peak_error"] for g in gathered if g.get("peak_error")), None)
    if why or any(g["peak"] is None for g in gathered):
        return {"rss_peak_bytes": rss, "peak_error": why or "no memory peak measured"}
    refresh = [g["peaks"]["refresh"] for g in gathered if "refresh" in g["peaks"]]
    return {
        "peak_mem_bytes": int(max(g["peak"] for g in gathered)),
        "plain_peak_bytes": int(max(g["peaks"]["plain"] for g in gathered)),
        "refresh_peak_bytes": int(max(refresh)) if refresh else None,
        "rss_peak_bytes": rss,
    }


def _input(gathered: list[dict], step_s: float) -> dict[str, Any]:
    """The input pipeline's time per batch (the slowest rank's) and whether it sets the pace."""
    times = [g["input"] for g in gathered if g.get("input")]
    if not times:
        return {"input_time_s": None, "input_bound": None}
    return {"input_time_s": max(times), "input_bound": bool(max(times) >= INPUT_BOUND * step_s)}
