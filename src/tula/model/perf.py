"""Step-time model (Eq. 2) and training time (Eq. 4a) for every grid point.

    t_step(N, b) = t_compute(b, N) (+) t_sync(N)
    T            = E * ceil(D / B) * t_step    (Eq. 4a with whole steps per epoch)

Each part is a choice among candidate forms (:mod:`tula.model.forms`; :mod:`tula.model.formchoice`
chooses by held-out error on what was measured, simplest first).

Each point is weighted by its measured precision (the 95 % half-width of its mean, from the
probe's timer): a point timed to +-1 % pulls harder than one timed to +-10 %
(:func:`tula.model.curvefit.weights_from`). All parameters are bounded at zero or above
(gamma in [1, 8]), so compute is never negative nor decreasing in b. The chosen forms, their
parameters with 95 % intervals and why each won are recorded in perf.json, with every probe's
residual beside its measured noise.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from tula.model import curvefit, formchoice
from tula.model.curvefit import Fitted, Form, Inputs
from tula.model.floor import INPUT_FORMS, fit_input
from tula.model.forms import (
    COLLECTIVE_TERMS,
    COMPUTE_FORMS,
    LATENCY_TERMS,
    compute_forms,
    step_form,
    step_forms,
    sync_feature,
    two_level_forms,
)
from tula.model.grid import nodes_of
from tula.model.measurements import INPUT_BOUND, as_micro_batches, once_at, once_per_step


@dataclass(frozen=True)
class PerfModel:
    collective: str
    compute: Fitted  # compute_time_s vs (local batch, N)
    step: Fitted | None  # step_time_s of N > 1 given the compute model; None: no multi-worker probe
    residuals: tuple[dict[str, Any], ...] = ()
    workers_per_node: int = 1  # cluster.workers_per_node: k = ceil(N / it) nodes, g = N / k on each
    # input_time_s vs (local batch, workers per node); None: not measured
    input: Fitted | None = None
    # (N, seconds): what a compute-only step pays once, whatever its micro-batches (the
    # probes' compute_time_s less micro_time_s, median at each N); empty: not measured
    once: tuple[tuple[float, float], ...] = ()

    def once_s(self, workers) -> np.ndarray:
        """What a step pays once at N (the nearest measured N's, interpolated between): the
        optimizer's step, the flags' all-reduce, the batch's fetch; 0 where not measured."""
        return once_at(self.once, workers)

    def _cx(self, workers, local_batch) -> Inputs:
        b = np.asarray(local_batch, dtype=float)
        n = np.broadcast_to(np.asarray(workers, dtype=float), b.shape).astype(float)
        return {"b": b, "n": n}

    def compute_time_s(self, workers, local_batch) -> np.ndarray:
        return np.maximum(self.compute.predict(self._cx(workers, local_batch)), 0.0)

    def _sx(self, workers, local_batch) -> Inputs:
        X = self._cx(workers, local_batch)
        k = nodes_of(X["n"], self.workers_per_node)
        return {
            "c": self.compute_time_s(workers, local_batch),
            "x": sync_feature(self.collective, X["n"]),
            "l": LATENCY_TERMS[self.collective][1](X["n"]),
            "n": X["n"],
            "k": k,
            "xg": sync_feature(self.collective, X["n"] / k),
            "xk": sync_feature(self.collective, k),
            "multi": (k > 1).astype(float),
        }

    def model_step_time_s(self, workers, local_batch) -> np.ndarray:
        """The step from compute and sync alone, without the input floor."""
        c = self.compute_time_s(workers, local_batch)
        if self.step is None:
            return c
        X = self._sx(workers, local_batch)
        # sync never makes a step faster
        return np.where(X["n"] <= 1, c, np.maximum(self.step.predict(X), c))

    def input_time_s(self, workers, local_batch) -> np.ndarray:
        """The input pipeline's time per batch alone; 0 where it was not measured."""
        X = self._cx(workers, local_batch)
        if self.input is None:
            return np.zeros_like(X["b"])
        return np.maximum(
            self.input.predict(
                {"b": X["b"], "n": X["n"] / nodes_of(X["n"], self.workers_per_node)}
            ),
            0.0,
        )

    def step_time_s(self, workers, local_batch) -> np.ndarray:
        """A step: no faster than its compute and sync, nor than its input (the floor)."""
        return np.maximum(
            self.model_step_time_s(workers, local_batch), self.input_time_s(workers, local_batch)
        )

    def input_bound(self, workers, local_batch) -> np.ndarray:
        """Where the input alone takes at least INPUT_BOUND of the step: it sets the pace."""
        t_in = self.input_time_s(workers, local_batch)
        return (t_in > 0) & (t_in >= INPUT_BOUND * self.step_time_s(workers, local_batch))

    def sync_time_s(self, workers, local_batch) -> np.ndarray:
        return self.model_step_time_s(workers, local_batch) - self.compute_time_s(
            workers, local_batch
        )

    def step_time_interval_s(
        self, workers, local_batch, alpha: float = 0.05
    ) -> tuple[np.ndarray, np.ndarray]:
        """95 % prediction interval of a step: the compute and step fits' half-widths in
        quadrature."""
        t = self.step_time_s(workers, local_batch)
        half = self.compute.half_width(self._cx(workers, local_batch), alpha)
        if self.step is not None:
            X = self._sx(workers, local_batch)
            half = np.sqrt(
                half**2 + np.where(X["n"] <= 1, 0.0, self.step.half_width(X, alpha)) ** 2
            )
        floor = self.input_time_s(workers, local_batch)
        return np.maximum(np.maximum(t - half, 0.0), floor), np.maximum(t + half, floor)

    def accumulated(self, workers, local_batch, k) -> dict[str, np.ndarray]:
        """A step of ``local_batch`` samples per worker as ``k`` micro-batches
        (``train.accumulate``): k - 1 micro-batches of b / k (a compute-only step less what a
        step pays once, :meth:`once_s`), then a whole step with the sync, no faster than the k
        micro-batches' input: max((k - 1) (c(b / k) - once) + step(b / k), k input(b / k)).
        Its compute, sync, input and step, and the step's 95 % interval: the micro-step's,
        widened by k - 1 times the compute's half-width (the same fit: its errors add). k = 1
        is :meth:`step_time_s` and its parts."""
        k = np.asarray(k, dtype=float)
        m = np.asarray(local_batch, dtype=float) / k
        c = self.compute_time_s(workers, m)
        t_in = k * self.input_time_s(workers, m)
        # the micro-batches before the synced step
        more = (k - 1) * np.maximum(c - self.once_s(workers), 0.0)
        step = np.maximum(self.model_step_time_s(workers, m) + more, t_in)
        lo, hi = self.step_time_interval_s(workers, m)
        half = (k - 1) * self.compute.half_width(self._cx(workers, m))
        return {
            "compute_time_s": c + more,
            "sync_time_s": self.sync_time_s(workers, m),
            "input_time_s": t_in,
            "input_bound": (t_in > 0) & (t_in >= INPUT_BOUND * step),
            "step_time_s": step,
            "step_time_lo_s": np.maximum(np.maximum(lo + more - half, 0.0), t_in),
            "step_time_hi_s": np.maximum(hi + more + half, t_in),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "equation": "step_time_s = max(compute(b, N) (+) sync(N), input(b, g)), "
            "forms chosen by held-out error  (Eq. 2 with the input pipeline's floor)",
            "collective": self.collective,
            "sync_term": COLLECTIVE_TERMS[self.collective][0],
            "workers_per_node": self.workers_per_node,
            "compute": self.compute.to_dict(),
            "step": self.step.to_dict() if self.step is not None else None,
            "input": self.input.to_dict() if self.input is not None else None,
            "residuals": list(self.residuals),
            "once_s": [list(p) for p in self.once],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PerfModel":
        try:
            return cls(
                d["collective"],
                _fitted(d["compute"], COMPUTE_FORMS[d["compute"]["form"]]),
                _fitted(d["step"], step_form(d["step"]["form"], d["collective"]))
                if d.get("step")
                else None,
                tuple(d.get("residuals", ())),
                int(d.get("workers_per_node", 1)),
                _fitted(d["input"], INPUT_FORMS[d["input"]["form"]]) if d.get("input") else None,
                tuple(tuple(p) for p in d.get("once_s", ())),
            )
        except KeyError as exc:
            raise ValueError(f"perf.json: missing {exc}; re-run `tula fit`") from None


def _fitted(d: dict[str, Any], form: Form) -> Fitted:
    return Fitted(
        form,
        tuple(d["params"][p] for p in form.params),
        tuple(tuple(r) for r in d["cov"]),
        float(d["sigma_rel"]),
        int(d["dof"]),
        int(d["n_points"]),
        {
            k: d[k]
            for k in ("criterion", "cross_validation", "candidates", "why", "interval_from")
            if k in d
        },
    )


def _choose(
    kept: Fitted | None,
    forms: list[Form],
    X: Inputs,
    y: np.ndarray,
    what: str,
    noise: np.ndarray | None,
    weights: np.ndarray | None,
) -> Fitted:
    """The best of ``forms`` by held-out error, or ``kept``'s form fitted again (a resample),
    started from ``kept``'s parameters alone (a resample's optimum is near them: the form's
    several starts cost the choice's resamples most of their time), from the form's own starts
    only where that fails."""
    if kept is not None:
        near = replace(kept.form, starts=lambda X, y: [np.asarray(kept.theta, float)])
        try:
            return replace(curvefit.fit(near, X, y, noise, weights), form=kept.form)
        except ValueError:  # no convergence from there: the form's own starts
            return curvefit.fit(kept.form, X, y, noise, weights)
    return formchoice.choose(forms, X, y, what, noise, weights)


def _fit_compute(ok: pd.DataFrame, kept: Fitted | None) -> Fitted:
    """The compute model on every row that timed compute (probes and sweeps), its forms
    bounded by these rows' largest local batch; ``kept``'s form (perf.json's carries no bounds
    of its own) fitted again with those bounds."""
    comp = ok[
        np.isfinite(pd.to_numeric(ok["compute_time_s"], errors="coerce"))
        & (ok["compute_time_s"] > 0)
    ]
    if comp.empty:
        raise ValueError("step-time model: no successful compute-time measurement to fit")
    Xc = {"b": comp["local_batch"].to_numpy(float), "n": comp["workers"].to_numpy(float)}
    forms = compute_forms(float(Xc["b"].max()))
    if kept is not None:
        kept = replace(kept, form=next(f for f in forms if f.name == kept.form.name))
    if len(np.unique(Xc["n"])) < 2:
        # one N: sharing cannot be seen
        forms = [f for f in forms if not f.name.endswith("_shared")]
    return _choose(
        kept,
        forms,
        Xc,
        comp["compute_time_s"].to_numpy(float),
        "compute model",
        None,
        curvefit.weights_from(_column(comp, "compute_time_halfwidth_rel")),
    )


def fit(
    measurements: pd.DataFrame,
    collective: str,
    workers_per_node: int = 1,
    keep: PerfModel | None = None,
) -> PerfModel:
    """Choose and fit the compute and step forms on the ok rows; a job of N workers ran on
    ceil(N / workers_per_node) nodes (a ``nodes`` column, where the measurements have one,
    must agree: the model predicts the layout the probes measured). ``keep``: a model fitted
    before, whose forms (and input floor) are fitted again on these rows instead of chosen
    anew: the choice's resamples (:mod:`tula.model.robust`)."""
    if collective not in COLLECTIVE_TERMS:
        raise ValueError(f"config key 'hardware.collective': unknown collective {collective!r}")
    # a step measured as micro-batches (train.accumulate), as the one-batch steps it is made of
    once = once_per_step(measurements[measurements["status"] == "ok"])
    ok = as_micro_batches(measurements[measurements["status"] == "ok"], once)
    compute = _fit_compute(ok, keep.compute if keep else None)
    probes = ok[(ok["source"] == "probe") if "source" in ok.columns else slice(None)]
    probes = probes[
        np.isfinite(pd.to_numeric(probes["step_time_s"], errors="coerce"))
        & (probes["step_time_s"] > 0)
    ]
    _check_layout(probes, workers_per_node)
    floor = keep.input if keep else fit_input(probes, workers_per_node)
    model = PerfModel(collective, compute, None, workers_per_node=workers_per_node, input=floor)
    multi = probes[probes["workers"] > 1]
    if len(multi):
        model = replace(model, step=_fit_step(model, probes, multi, collective, keep))
    if keep is None:  # a resample's residuals are not read
        model = replace(model, residuals=tuple(residuals(model, probes)))
    return replace(model, once=once)


def _fit_step(
    model: PerfModel,
    probes: pd.DataFrame,
    multi: pd.DataFrame,
    collective: str,
    keep: PerfModel | None,
) -> Fitted:
    """The step model on the multi-worker probes, given the compute model: the collective's
    forms, its latency forms where three N were probed, the two-level forms where both sides
    of a node boundary were; chosen by held-out error (or ``keep``'s form fitted again)."""
    n = multi["workers"].to_numpy(float)
    X = model._sx(n, multi["local_batch"].to_numpy(float))
    latency = probes["workers"].nunique() >= 3 and len(np.unique(n)) >= 2 and collective != "tree"
    forms = step_forms(collective, False) + (step_forms(collective, True) if latency else [])
    if (X["multi"] > 0).any() and ((X["multi"] == 0) & (X["n"] > 1)).any():
        forms += two_level_forms(collective)  # both sides of a node boundary were measured
    forms.sort(key=lambda f: len(f.params))
    noise = _mean_noise(multi)
    return _choose(
        keep.step if keep else None,
        forms,
        X,
        multi["step_time_s"].to_numpy(float),
        "step model",
        noise,
        curvefit.weights_from(_column(multi, "step_time_halfwidth_rel")),
    )


def _mean_noise(rows: pd.DataFrame) -> np.ndarray | None:
    """Each probe's mean step time's relative standard error: its 95 % half-width / 1.96 (the
    timer's), else (records without one) its step-time CV, which the probe then took over block
    means."""
    cv = _column(rows, "step_time_cv")
    hw = _column(rows, "step_time_halfwidth_rel")
    if hw is None:
        return cv
    se = hw / 1.96
    return se if cv is None else np.where(np.isfinite(se), se, cv)


def _column(rows: pd.DataFrame, name: str) -> np.ndarray | None:
    """A numeric column of the rows (None where the table has none: measurements from elsewhere)."""
    return pd.to_numeric(rows[name], errors="coerce").to_numpy(float) if name in rows else None


def _check_layout(probes: pd.DataFrame, workers_per_node: int) -> None:
    if "nodes" not in probes.columns:
        return
    nodes = pd.to_numeric(probes["nodes"], errors="coerce")
    expect = nodes_of(probes["workers"].to_numpy(float), workers_per_node)
    bad = nodes.notna() & (nodes.to_numpy(float) != expect)
    if bad.any():
        r = probes[bad].iloc[0]
        raise ValueError(
            f"measurements: the probe of N={int(r['workers'])} ran on {int(r['nodes'])} node(s), "
            f"but cluster.workers_per_node={workers_per_node} puts it on "
            f"{int(expect[bad.to_numpy()][0])}: the model would predict another layout than the "
            "one measured; set cluster.workers_per_node to the probes' (or probe again)"
        )


def residuals(model: PerfModel, probes: pd.DataFrame) -> list[dict[str, Any]]:
    """Each probe's measured step time beside the model's, and how precisely it was measured
    (``noise_pct``: the 95 % half-width of its mean; records without one: its step-time CV)."""
    out = []
    pred = model.step_time_s(
        probes["workers"].to_numpy(float), probes["local_batch"].to_numpy(float)
    )
    for (_, r), p in zip(probes.iterrows(), pred):
        err = 100.0 * (p - r["step_time_s"]) / r["step_time_s"]
        hw, cv = r.get("step_time_halfwidth_rel"), r.get("step_time_cv")
        known = hw if hw is not None and np.isfinite(hw) else cv
        noise = 100.0 * float(known) if known is not None and np.isfinite(known) else None
        out.append(
            {
                "workers": int(r["workers"]),
                "nodes": int(nodes_of(r["workers"], model.workers_per_node)),
                "global_batch": int(r["global_batch"]),
                "measured_step_time_s": float(r["step_time_s"]),
                "predicted_step_time_s": float(p),
                "error_pct": float(err),
                "noise_pct": noise,
                "input_bound": bool(model.input_bound(r["workers"], r["local_batch"])),
                "within_noise": None if noise is None else bool(abs(err) <= noise),
            }
        )
    return out


def evaluation_time(row):
    """The run's evaluation: its first pass, then one later pass per further epoch (a
    predictions.csv row, or the frame)."""
    return row["eval_first_time_s"] + (row["epochs"] - 1) * row["eval_time_s"]
