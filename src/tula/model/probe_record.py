"""The probe record (``results/partitions/<name>/probes/N{n}/B{b}.json``, schema
``tula.probe/1``), typed: the one place that says what it holds. :class:`RankResult` is what
one rank wrote at a point (``rank<r>.json``; :mod:`tula.runtime.probe.probe_worker`), rank 0's
holding the measured parts;
:class:`ProbeRecord` is the point's record (:mod:`tula.stages.probe`): what was probed, how it
ended, rank 0's result (its parts: :mod:`tula.model.probe_measured`) and the launcher's
notes. Each part is frozen, owned by the module its docstring names, built from what the
measuring functions return and changed only by its own methods; units are in the names
(``_s``, ``_bytes``, ``_rel``: a fraction of the mean) or beside them. The JSON keeps the flat
keys results/README.md names (``to_json``, ``from_json``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tula.model.probe_measured import (
    ARMS,
    Arm,
    Measurement,
    Noise,
    Overheads,
    TimingFigures,
    keys,
)

SCHEMA = "tula.probe/1"
# the phases after the probe's own measurement: a failure there is noted beside it
AFTER_MEASUREMENT = ("overheads", "noise", "sweep")


def _pick(cls, d: dict[str, Any]):
    """A part from the flat JSON: its keys, or None where the JSON has none of them."""
    if not any(k in d for k in keys(cls)):
        return None
    return cls(**{k: d[k] for k in keys(cls) if k in d})


@dataclass(frozen=True)
class Probed:
    """What was probed; owner: the launcher (:func:`tula.stages.probe.job.combine`), from the
    point and the config."""

    workers: int  # N
    global_batch: int  # B, samples per step over all workers
    local_batch: int | None = None  # B / N
    nodes: int | None = None  # the job's nodes
    model: str | None = None
    dataset: str | None = None
    warmup_steps: int | None = None  # probe.warmup_steps
    timed_steps: int | None = None  # probe.timed_steps: the judged steps each arm needs
    accumulate: int | None = None  # train.accumulate's k micro-batches a step (None: one)
    schema: str = SCHEMA


@dataclass(frozen=True)
class Failure:
    """What ended a point before its measurement stood; owner: the rank that failed
    (:func:`tula.runtime.probe.probe_worker._failure`) or the launcher (a timeout, a silent
    exit)."""

    status: str  # oom | error | timeout
    error: str = ""
    traceback: str | None = None
    failed_at: float | None = None  # epoch seconds (the first rank to fail is the cause)


def _failure_json(f: Failure) -> dict[str, Any]:
    return {k: v for k, v in asdict(f).items() if v is not None}


@dataclass(frozen=True)
class RankResult:
    """What one rank wrote at a point (rank 0's parts are the record's; the others' empty): the
    measured parts, the sweep's rows (the job's first point sweeps for all: ``sweep_in``), a
    failure (then the result is it alone), errors after the measurement (which then stands)
    and the point's own seconds. Owner: :mod:`tula.runtime.probe.probe_worker`."""

    rank: int
    measured: Measurement | None = None
    overheads: Overheads | None = None
    noise: Noise | None = None
    sweep: list[dict[str, Any]] | None = None  # rows: tula.runtime.probe.sweep
    sweep_in: str | None = None
    failure: Failure | None = None
    phase_errors: dict[str, str] = field(default_factory=dict)  # AFTER_MEASUREMENT's
    point_wall_s: float | None = None

    def measured_as(self, m: Measurement | None) -> RankResult:
        return replace(self, measured=m, sweep=[] if m is not None else self.sweep)

    def with_overheads(self, o: Overheads | None, error: str | None = None) -> RankResult:
        done = replace(self, overheads=o)
        return done.noted("overheads", error) if error else done

    def with_noise(self, n: Noise | None) -> RankResult:
        return replace(self, noise=n)

    def swept(self, rows: list[dict[str, Any]] | None, at: str) -> RankResult:
        return replace(self, sweep=self.sweep if rows is None else rows, sweep_in=at)

    def failed_with(self, f: Failure) -> RankResult:
        return replace(self, failure=f)

    def noted(self, phase: str, error: str) -> RankResult:
        """A phase after the measurement failed: noted beside it."""
        if phase not in AFTER_MEASUREMENT:
            raise ValueError(f"{phase!r} is not one of {AFTER_MEASUREMENT}")
        return replace(self, phase_errors={**self.phase_errors, phase: error})

    def timed(self, point_wall_s: float) -> RankResult:
        return replace(self, point_wall_s=point_wall_s)

    @property
    def failed(self) -> bool:
        """The point failed before its measurement stood (its record is the failure)."""
        return self.failure is not None

    @property
    def failed_after_measurement(self) -> bool:
        return bool(self.phase_errors)

    def parts_json(self) -> dict[str, Any]:
        """The measured parts' flat keys (no rank, no status)."""
        out: dict[str, Any] = {}
        out |= self.measured.to_json() if self.measured else {}
        out |= {"sweep": self.sweep} if self.sweep is not None else {}
        out |= asdict(self.overheads) if self.overheads else {}
        out |= self.noise.to_json() if self.noise else {}
        out |= {"sweep_in": self.sweep_in} if self.sweep_in is not None else {}
        out |= {f"{p}_error": e for p, e in self.phase_errors.items()}
        out |= {"point_wall_s": self.point_wall_s} if self.point_wall_s is not None else {}
        return out

    def to_json(self) -> dict[str, Any]:
        if self.failure is not None:
            return {"rank": self.rank, **_failure_json(self.failure)}
        return {"rank": self.rank, "status": "ok", **self.parts_json()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RankResult:
        if d.get("status", "ok") != "ok":
            return cls(d.get("rank", -1), failure=_pick(Failure, d))
        return cls(d.get("rank", -1), **_parts(d))


def _parts(d: dict[str, Any]) -> dict[str, Any]:
    """A rank result's measured parts from flat JSON keys."""
    return {
        "measured": Measurement.from_json(d),
        "overheads": _pick(Overheads, d),
        "noise": _pick(Noise, d),
        "sweep": d.get("sweep"),
        "sweep_in": d.get("sweep_in"),
        "phase_errors": {p: d[f"{p}_error"] for p in AFTER_MEASUREMENT if f"{p}_error" in d},
        "point_wall_s": d.get("point_wall_s"),
    }


@dataclass(frozen=True)
class ProbeRecord:
    """One point's record (``results/partitions/<name>/probes/N{n}/B{b}.json``); owner:
    :mod:`tula.stages.probe` (:func:`tula.stages.probe.job.combine` builds it from the ranks'
    results and the launch; the launcher's notes are added by this record's methods).
    ``result`` is rank 0's, when ok."""

    probed: Probed
    status: str  # ok | oom | error | timeout
    error: str | None = None
    traceback: str | None = None
    result: RankResult | None = None
    wall_s: float | None = None  # the point's own seconds and its share of the launch's
    job_wall_s: float | None = None  # the launch's wall, start-up and teardown included
    started_at: str | None = None  # the launch's start, UTC
    ranks_reached: list[dict[str, Any]] | None = None  # where each rank was, if not ok
    lost_ranks: list[int] | None = None  # ranks that died without writing their result
    after_error: str | None = None  # ok, but a rank was lost after the measurement stood
    retried_after: dict[str, Any] | None = None  # the first launch's error, launched again
    fallbacks: list[ProbeRecord] | None = None  # smaller batches probed after an OOM
    settings: str | None = None  # what it was measured with (tula.pipeline.stage_settings)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def measured(self) -> Measurement:
        """Rank 0's measurement (an empty one where the point measured nothing)."""
        return (self.result.measured if self.result else None) or Measurement()

    @property
    def sweep(self) -> list[dict[str, Any]]:
        return (self.result.sweep if self.result else None) or []

    @property
    def sweep_in(self) -> str | None:
        return self.result.sweep_in if self.result else None

    def with_launch(self, started_at: str) -> ProbeRecord:
        return replace(self, started_at=started_at)

    def with_wall(self, wall_s: float) -> ProbeRecord:
        """Its wall: its own seconds and its share of what the launch paid once."""
        return replace(self, wall_s=wall_s)

    def with_lost(self, lost: list[int]) -> ProbeRecord:
        """Ranks ``lost`` died without writing their result: said in the record."""
        died = (
            f"rank(s) {lost} died without writing a result (killed by a signal: a segfault or "
            "the out-of-memory killer, or stopped by the launcher after a peer died)"
        )
        if self.status == "error":
            # its peers only saw the connection drop, so the error they report is not the
            # cause; a peer may also have been stopped by the launcher before it wrote its own
            return replace(self, lost_ranks=lost, error=f"{died}; {self.error}")
        if self.ok:
            # rank 0 wrote the measurement as soon as it stood; what came after it (the
            # overheads, the gradient noise, the compute sweep) ended with the lost rank
            why = (
                f"{died} after the measurement stood: this record holds what rank 0 wrote "
                f"before ({len(self.sweep)} sweep rows)"
            )
            return replace(self, lost_ranks=lost, after_error=why)
        return self

    def with_retry(self, first_error: str, lost: list[int]) -> ProbeRecord:
        return replace(self, retried_after={"error": first_error, "lost_ranks": lost})

    def with_fallbacks(self, fallbacks: list[ProbeRecord]) -> ProbeRecord:
        return replace(self, fallbacks=list(fallbacks))

    def with_settings(self, settings: str | None) -> ProbeRecord:
        return replace(self, settings=settings)

    def to_json(self) -> dict[str, Any]:
        """The record as the user reads it: flat keys, as results/README.md names them."""
        p = self.probed
        out: dict[str, Any] = {"schema": p.schema}
        out |= {k: getattr(p, k) for k in keys(Probed) if k != "schema"}
        if p.accumulate is None:  # a step of one batch: the record as before accumulation
            del out["accumulate"]
        out["status"] = self.status
        out |= {k: getattr(self, k) for k in ("error", "traceback") if getattr(self, k)}
        out |= self.result.parts_json() if self.result and self.ok else {}
        for k in _NOTES:
            v = getattr(self, k)
            if v is not None:
                out[k] = [f.to_json() for f in v] if k == "fallbacks" else v
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProbeRecord:
        """A record read back; ValueError naming what is missing or not a probe record's."""
        missing = [k for k in ("workers", "global_batch", "status") if k not in d]
        if missing:
            raise ValueError(f"not a probe record (missing {', '.join(missing)})")
        unknown = sorted(set(d) - set(json_keys()))
        if unknown:
            raise ValueError(f"not a probe record's key(s): {', '.join(unknown)}")
        notes = {k: d.get(k) for k in _NOTES}
        if notes["fallbacks"] is not None:
            notes["fallbacks"] = [cls.from_json(f) for f in notes["fallbacks"]]
        ok = d["status"] == "ok"
        return cls(
            probed=Probed(**{k: d[k] for k in keys(Probed) if k in d}),
            status=d["status"],
            error=d.get("error"),
            traceback=d.get("traceback"),
            result=RankResult(0, **_parts(d)) if ok else None,
            **notes,
        )


_NOTES = keys(ProbeRecord)[5:]  # the launcher's notes, after what the point measured


def json_keys() -> tuple[str, ...]:
    """Every key a probe record's JSON may hold."""
    measured = [k for k in keys(Measurement) if k != "timing"]
    timing = [f"{a}_{k}" for a in ARMS for k in keys(Arm)] + list(keys(TimingFigures)[2:])
    return (
        *keys(Probed),
        *("status", "error", "traceback"),
        *measured,
        *timing,
        *("sweep", "sweep_in", "point_wall_s"),
        *keys(Overheads),
        *keys(Noise),
        *(f"{p}_error" for p in AFTER_MEASUREMENT),
        *_NOTES,
    )
