"""What rank 0 measured at a probe's point, part by part, each owned by the function that
measures it (:mod:`tula.model.probe_record` puts them in the record): the timed steps and how
they were timed (:class:`Measurement`, :class:`TimingFigures` of one :class:`Arm` each), what
the production job pays besides its steps (:class:`Overheads`) and the gradient noise scale
(:class:`Noise`). Units are in the names (``_s`` seconds, ``_bytes``, ``_rel``: a fraction of
the mean) or beside them; the JSON keys are flat, as results/README.md names them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


def keys(cls) -> tuple[str, ...]:
    """A record's field names, in order."""
    return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class Arm:
    """How one timed arm (``step``: synced; ``compute``: under ``no_sync()``) was timed;
    owner: :meth:`tula.runtime.timer.timing.Timing.figures`. Keys ``<arm>_<field>``."""

    timed_steps: int  # plain full-batch steps its mean is over
    judged_steps: int  # the steps its half-width is over
    other_steps: dict[str, int]  # steps of other kinds met while timing, by kind
    halfwidth_mix: dict[str, float] | None  # shares of the other kinds weighed in
    time_halfwidth_rel: float | None  # 95 % half-width of the mean, over the mean
    time_halfwidth_judged_rel: float | None  # the half-width the precision rule judged
    spread: str  # sd | mad
    spikes: int  # steps that spiked
    host_share: float | None  # host's time to queue a step over its device time


ARMS = ("step", "compute")


@dataclass(frozen=True)
class TimingFigures:
    """How the steps were timed; owner: :meth:`tula.runtime.timer.timing.Timing.figures` (a probe
    times both arms; a timer of one arm has the other None)."""

    step: Arm | None = None
    compute: Arm | None = None
    precision_target: float | None = None  # probe.precision
    precision_reached: bool | None = None
    timing_stopped_by: str | None = None  # precision | budget | max_steps
    timing_s: float | None = None
    timing_budget_s: float | None = None  # probe.time_budget_s
    timing_mode: str | None = None  # steps | blocks
    block_steps: int | None = None  # steps per timed sample

    def to_json(self) -> dict[str, Any]:
        arms = {a: getattr(self, a) for a in ARMS}
        out = {f"{a}_{k}": v for a, arm in arms.items() if arm for k, v in asdict(arm).items()}
        return out | {k: getattr(self, k) for k in keys(self)[len(ARMS) :]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TimingFigures | None:
        arms = {a: {k: d[f"{a}_{k}"] for k in keys(Arm) if f"{a}_{k}" in d} for a in ARMS}
        rest = {k: d[k] for k in keys(cls)[len(ARMS) :] if k in d}
        if not rest and not any(arms.values()):
            return None
        return cls(**{a: _arm(v) for a, v in arms.items()}, **rest)


def _arm(figures: dict[str, Any]) -> Arm | None:
    """An arm from its keys (an older record's missing ones read as None)."""
    return Arm(**{k: figures.get(k) for k in keys(Arm)}) if figures else None


@dataclass(frozen=True)
class Measurement:
    """The probe's own measurement at (N, B), rank 0's of every rank's timed steps; owner:
    :func:`tula.runtime.probe.probe_measurement.measurement` and
    :func:`tula.runtime.probe.probe_worker._measure_point` (memory, environment). Every list is
    seconds per timed sample; counts are steps."""

    step_time_s: float | None = None  # mean synced step, at training's rate of extras
    compute_time_s: float | None = None  # the same under no_sync()
    # of it, its micro-batches' move to the device, forward and backward (the rest: paid once)
    micro_time_s: float | None = None
    sync_time_s: float | None = None  # step - compute, >= 0
    epoch_start_extra_s: float | None = None
    refresh_extra_s: float | None = None
    partial_extra_s: float | None = None  # the short last batch less a full step
    partial_step_times_s: list[float] | None = None
    steps_per_epoch: int | None = None
    epoch_start_step_times_s: list[float] | None = None
    refresh_step_times_s: list[float] | None = None
    lead_in_steps: dict[str, int] | None = None  # untimed, by kind
    step_time_median_s: float | None = None
    compute_time_median_s: float | None = None
    step_time_iqr_s: float | None = None
    compute_time_iqr_s: float | None = None
    step_time_cv: float | None = None  # standard deviation over the mean
    compute_time_cv: float | None = None
    step_times_s: list[float] | None = None
    compute_times_s: list[float] | None = None
    timing: TimingFigures | None = None  # flattened into the record's keys
    peak_mem_bytes: int | None = None  # the larger of plain and refresh
    plain_peak_bytes: int | None = None
    refresh_peak_bytes: int | None = None
    rss_peak_bytes: int | None = None
    # why the peaks are missing (torch's CPU profiler failed every try); the timing stands
    peak_error: str | None = None
    train_samples: int | None = None
    first_steps_time_s: float | None = None
    first_short_step_s: float | None = None
    compile: str | None = None  # train.compile as run
    on_device: bool | None = None  # the training set resident on the device
    decode: str | None = None  # cpu | gpu, data.decode auto's choice
    decode_faster_by: float | None = None  # ratio
    decode_choice: dict[str, Any] | None = None
    input_time_s: float | None = None  # per batch, the input pipeline alone
    input_bound: bool | None = None
    host_bound: bool | None = None
    steps_run: int | None = None
    optimizer_counters: dict[str, int] | None = None
    grad_bytes_per_step: int | None = None
    memory: dict[str, int] | None = None  # Eq. 3's terms, bytes
    profiler_retries: dict[str, int] | None = None  # per memory step
    env: dict[str, Any] | None = None
    fresh_process: bool | None = None  # its first steps were the process's

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in keys(self):
            v = getattr(self, k)
            if k == "timing":
                out |= v.to_json() if v is not None else {}
            else:
                out[k] = v
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Measurement | None:
        own = {k: d[k] for k in keys(cls) if k in d and k != "timing"}
        timing = TimingFigures.from_json(d)
        return cls(**own, timing=timing) if own or timing else None


@dataclass(frozen=True)
class Overheads:
    """What the production job pays besides its steps, each the slowest rank's; owner:
    :func:`tula.runtime.probe.probe_worker._overheads`."""

    startup_time_s: float | None = None  # process start to the first step
    eval_first_time_s: float | None = None  # the job's first evaluation pass
    eval_time_s: float | None = None  # each later pass
    checkpoint_time_s: float | None = None  # one checkpoint write


@dataclass(frozen=True)
class Noise:
    """The gradient noise scale (B_noise = tr(Sigma) / |G|^2); owner:
    :func:`tula.runtime.probe.gradnoise.measure`. ``gradient_noise`` holds the estimate in full,
    or why there is none (one worker)."""

    gradient_noise: dict[str, Any] | None = None
    grad_noise_scale: float | None = None  # samples
    grad_sq: float | None = None
    grad_trace: float | None = None
    grad_sq_se: float | None = None
    grad_trace_se: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Its keys; where no estimate was made (one worker), ``gradient_noise`` alone."""
        out = asdict(self)
        estimated = any(out[k] is not None for k in keys(self)[1:])
        return out if estimated else {"gradient_noise": self.gradient_noise}
