"""Step-time model (Eq. 2) and training time (Eq. 4a) for every grid point.

    t_step(N, b) = t_compute(b, N) (+) t_sync(N)
    T            = E * ceil(D / B) * t_step    (Eq. 4a with whole steps per epoch)

Each part is a choice among candidate forms (:mod:`tula.model.curvefit`), made by held-out error
on what was measured, simplest first:

compute, fitted on every compute-only measurement (probe rows and the probe jobs' sweep rows):
    linear              c0 + c1*b
    linear_shared       (c0 + c1*b) * (1 + k*(N-1))        workers share a machine (CPU cores,
                                                           memory bandwidth): each is slower at larger N
    linear_shared_parts c0*(1 + k0*(N-1)) + c1*b*(1 + k1*(N-1))   the fixed and the per-sample cost
                                                           slowed by different amounts
    saturating          c0 + c1*max(b - b0, 0)             flat while the device is under-used, linear beyond (GPU)
    saturating_shared   the same times (1 + k*(N-1))
step, fitted on the multi-worker probes' step times given the compute model:
    additive            t_compute + s(N)                   exposed sync independent of b
    overlap             (t_compute^g + s(N)^g)^(1/g)       DDP overlaps sync with backward (AdaptDL's gamma)
    with s(N) = s1*x(N) (bandwidth: x = (N-1)/N ring | N param. server | log2 N tree) and, when at
    least three values of N are probed, + a*l(N) (latency: l = N-1, ring and ps; a tree's
    latency grows as log2 N like its bandwidth term, so s1 covers both).
  A job of N workers runs g = N / k workers on each of its k nodes (cluster.workers_per_node).
  When the probes saw both sides of a node boundary (a multi-worker job on one node and one on
  several), two more forms of s compete, each additive or overlapped like the above:
    two_level           s_r*x(g) + s_n*x(k)            hierarchical: inside the node, then across
                                                       nodes (AdaptDL/Pollux's two levels); with
                                                       one worker per node it is s_n*x(N), today's
    bottleneck          (s_r if k = 1 else s_n)*x(N)   one flat ring, as fast as its slowest link

All parameters are bounded at zero or above (gamma in [1, 8]), so compute is never negative
nor decreasing in b. The chosen forms, their parameters with 95 % intervals and why each won
are recorded in perf.json, with every probe's residual beside its measured noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd

from tula.model import curvefit
from tula.model.curvefit import Fitted, Form, Inputs
from tula.model.floor import INPUT_BOUND, INPUT_FORMS, fit_input
from tula.model.grid import nodes_of

COLLECTIVE_TERMS: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    "ring": ("(N-1)/N", lambda n: (n - 1.0) / n),
    "ps": ("N", lambda n: n.astype(float)),
    "tree": ("log2(N)", lambda n: np.log2(n)),
}
# A tree's latency term is log2(N) like its bandwidth term: one term covers both.
LATENCY_TERMS: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    "ring": ("N-1", lambda n: n - 1.0),
    "ps": ("N-1", lambda n: n - 1.0),
    "tree": ("", lambda n: np.zeros_like(n, dtype=float)),
}
INF = np.inf


def sync_feature(collective: str, workers) -> np.ndarray:
    if collective not in COLLECTIVE_TERMS:
        raise ValueError(f"config key 'hardware.collective': unknown collective {collective!r}")
    return COLLECTIVE_TERMS[collective][1](np.asarray(workers, dtype=float))


# -- compute forms (inputs b: local batch, n: workers) --------------------------------------


def _lin(th, X):
    return th[0] + th[1] * X["b"]


def _sat(th, X):
    return th[0] + th[1] * np.maximum(X["b"] - th[2], 0.0)


def _lin_parts(th, X):
    return th[0] * (1.0 + th[2] * (X["n"] - 1.0)) + th[1] * X["b"] * (1.0 + th[3] * (X["n"] - 1.0))


def _shared(base, k_index):
    return lambda th, X: base(th, X) * (1.0 + th[k_index] * (X["n"] - 1.0))


def _lin_starts(X, y):
    A = np.stack([np.ones_like(X["b"]), X["b"]], 1)
    c0, c1 = np.linalg.lstsq(A, y, rcond=None)[0]
    return [np.array([max(c0, 1e-9), max(c1, 1e-12)]), np.array([y.min(), (y.max() - y.min()) / max(np.ptp(X["b"]), 1)])]


def _sat_starts(X, y):
    bs = np.unique(X["b"])
    out = []
    for b0 in bs[: max(len(bs) - 1, 1)]:
        above = X["b"] > b0
        slope = np.polyfit(X["b"][above], y[above], 1)[0] if above.sum() >= 2 and np.ptp(X["b"][above]) > 0 else 0.0
        out.append(np.array([y[X["b"] <= b0].mean(), max(slope, 1e-12), b0]))
    return out


def _with_k(starts):
    return lambda X, y: [np.append(s, k) for s in starts(X, y) for k in (0.0, 0.5)]


def compute_forms(max_b: float) -> list[Form]:
    return [
        Form("linear", ("c0", "c1"), _lin, (0, 0), (INF, INF), _lin_starts, "c0 + c1*b"),
        Form("linear_shared", ("c0", "c1", "k"), _shared(_lin, 2), (0, 0, 0), (INF, INF, 10), _with_k(_lin_starts),
             "(c0 + c1*b) * (1 + k*(N-1))"),
        Form("linear_shared_parts", ("c0", "c1", "k0", "k1"), _lin_parts, (0, 0, 0, 0), (INF, INF, 10, 10),
             lambda X, y: [np.append(s, [k, k]) for s in _lin_starts(X, y) for k in (0.0, 0.5)],
             "c0*(1 + k0*(N-1)) + c1*b*(1 + k1*(N-1))"),
        Form("saturating", ("c0", "c1", "b0"), _sat, (0, 0, 0), (INF, INF, max_b), _sat_starts,
             "c0 + c1*max(b - b0, 0)"),
        Form("saturating_shared", ("c0", "c1", "b0", "k"), _shared(_sat, 3), (0, 0, 0, 0), (INF, INF, max_b, 10),
             _with_k(_sat_starts), "(c0 + c1*max(b - b0, 0)) * (1 + k*(N-1))"),
    ]  # fmt: skip


COMPUTE_FORMS = {f.name: f for f in compute_forms(1.0)}


# -- step forms (inputs c: predicted compute, x: bandwidth term, l: latency term) ---------


def _s(th, X, latency: bool):
    return th[0] * X["x"] + (th[1] * X["l"] if latency else 0.0)


def _additive(latency: bool):
    return _with_s(lambda th, X: _s(th, X, latency), overlap=False)


def _overlap(latency: bool):
    return _with_s(lambda th, X: _s(th, X, latency), overlap=True)


def _with_s(s_of, overlap: bool):
    """The step from the compute and a sync form ``s_of``: added, or overlapped with exponent
    gamma (the last parameter; AdaptDL's)."""
    def f(th, X):
        s = np.maximum(s_of(th, X), 0.0)
        if not overlap:
            return X["c"] + s
        g, c = th[-1], np.maximum(X["c"], 1e-12)
        m = np.maximum(c, s)
        return m * ((c / m) ** g + (s / m) ** g) ** (1.0 / g)

    return f


def _with_gamma(base: list[np.ndarray]) -> list[np.ndarray]:
    """Overlap forms' starts: each additive start, its sync scaled, with a gamma appended."""
    return [np.append(b * f, g) for b in base for f, g in ((1.0, 1.0), (1.5, 2.0), (3.0, 4.0))]


def _step_starts(latency: bool, overlap: bool):
    def starts(X, y):
        s1 = max(float(np.mean((y - X["c"]) / np.maximum(X["x"], 1e-9))), 1e-9)
        base = [np.array([s1, 0.0]) if latency else np.array([s1])]
        if latency:
            base.append(np.array([s1 / 2, s1 / 2 / max(float(X["l"].max()), 1.0)]))
        return _with_gamma(base) if overlap else base

    return starts


def step_forms(collective: str, latency: bool) -> list[Form]:
    bw, lat = COLLECTIVE_TERMS[collective][0], LATENCY_TERMS[collective][0]
    s = f"s1*{bw}" + (f" + a*{lat}" if latency else "")
    names = ("s1", "a") if latency else ("s1",)
    tag = "_latency" if latency else ""
    return [
        Form(f"additive{tag}", names, _additive(latency), (0,) * len(names), (INF,) * len(names),
             _step_starts(latency, False), f"t_compute + {s}"),
        Form(f"overlap{tag}", (*names, "gamma"), _overlap(latency), (0,) * len(names) + (1.0,),
             (INF,) * len(names) + (8.0,), _step_starts(latency, True), f"(t_compute^gamma + ({s})^gamma)^(1/gamma)"),
    ]  # fmt: skip


def _two_level_s(th, X):
    return th[0] * X["xg"] + th[1] * X["xk"]


def _bottleneck_s(th, X):
    return (th[0] * (1.0 - X["multi"]) + th[1] * X["multi"]) * X["x"]


def _level_starts(overlap: bool):
    def starts(X, y):
        extra = np.maximum(y - X["c"], 1e-9)
        one, multi = X["multi"] < 0.5, X["multi"] >= 0.5
        s_r = float(np.mean(extra[one] / np.maximum(X["x"][one], 1e-9))) if one.any() else float(np.mean(extra))
        s_n = float(np.mean(extra[multi] / np.maximum(X["x"][multi], 1e-9))) if multi.any() else s_r
        base = [np.array([max(s_r, 1e-9), max(s_n, 1e-9)]), np.array([max(s_r, 1e-9) / 2, max(s_n, 1e-9) * 2])]
        return _with_gamma(base) if overlap else base

    return starts


def two_level_forms(collective: str) -> list[Form]:
    """The sync forms that tell a node's inside from the links between nodes (used when the
    probes saw both: a multi-worker job on one node and one on several)."""
    x = COLLECTIVE_TERMS[collective][0]
    texts = {"two_level": f"s_r*{x.replace('N', 'g')} + s_n*{x.replace('N', 'k')}",
             "bottleneck": f"(s_r if k = 1 else s_n)*{x}"}  # fmt: skip
    out = []
    for name, s_of in (("two_level", _two_level_s), ("bottleneck", _bottleneck_s)):
        s = texts[name]
        out += [Form(f"additive_{name}", ("s_r", "s_n"), _with_s(s_of, False), (0, 0), (INF, INF),
                     _level_starts(False), f"t_compute + {s}"),
                Form(f"overlap_{name}", ("s_r", "s_n", "gamma"), _with_s(s_of, True), (0, 0, 1.0), (INF, INF, 8.0),
                     _level_starts(True), f"(t_compute^gamma + ({s})^gamma)^(1/gamma)")]  # fmt: skip
    return out


def _step_form(name: str, collective: str) -> Form:
    for f in step_forms(collective, False) + step_forms(collective, True) + two_level_forms(collective):
        if f.name == name:
            return f
    raise ValueError(f"perf.json: unknown step form {name!r}")


@dataclass(frozen=True)
class PerfModel:
    collective: str
    compute: Fitted  # compute_time_s vs (local batch, N)
    step: Fitted | None  # step_time_s of N > 1 given the compute model; None: no multi-worker probe
    residuals: tuple[dict[str, Any], ...] = ()
    workers_per_node: int = 1  # cluster.workers_per_node: k = ceil(N / it) nodes, g = N / k on each
    input: Fitted | None = None  # input_time_s vs (local batch, workers per node); None: not measured

    def _cx(self, workers, local_batch) -> Inputs:
        b = np.asarray(local_batch, dtype=float)
        n = np.broadcast_to(np.asarray(workers, dtype=float), b.shape).astype(float)
        return {"b": b, "n": n}

    def compute_time_s(self, workers, local_batch) -> np.ndarray:
        return np.maximum(self.compute.predict(self._cx(workers, local_batch)), 0.0)

    def _sx(self, workers, local_batch) -> Inputs:
        X = self._cx(workers, local_batch)
        k = nodes_of(X["n"], self.workers_per_node)
        return {"c": self.compute_time_s(workers, local_batch), "x": sync_feature(self.collective, X["n"]),
                "l": LATENCY_TERMS[self.collective][1](X["n"]), "n": X["n"], "k": k,
                "xg": sync_feature(self.collective, X["n"] / k), "xk": sync_feature(self.collective, k),
                "multi": (k > 1).astype(float)}  # fmt: skip

    def model_step_time_s(self, workers, local_batch) -> np.ndarray:
        """The step from compute and sync alone, without the input floor."""
        c = self.compute_time_s(workers, local_batch)
        if self.step is None:
            return c
        X = self._sx(workers, local_batch)
        return np.where(X["n"] <= 1, c, np.maximum(self.step.predict(X), c))  # sync never makes a step faster

    def input_time_s(self, workers, local_batch) -> np.ndarray:
        """The input pipeline's time per batch alone; 0 where it was not measured."""
        X = self._cx(workers, local_batch)
        if self.input is None:
            return np.zeros_like(X["b"])
        return np.maximum(self.input.predict({"b": X["b"], "n": X["n"] / nodes_of(X["n"], self.workers_per_node)}), 0.0)

    def step_time_s(self, workers, local_batch) -> np.ndarray:
        """A step: no faster than its compute and sync, nor than its input (the floor)."""
        return np.maximum(self.model_step_time_s(workers, local_batch), self.input_time_s(workers, local_batch))

    def input_bound(self, workers, local_batch) -> np.ndarray:
        """Where the input alone takes at least INPUT_BOUND of the step: it sets the pace."""
        t_in = self.input_time_s(workers, local_batch)
        return (t_in > 0) & (t_in >= INPUT_BOUND * self.step_time_s(workers, local_batch))

    def sync_time_s(self, workers, local_batch) -> np.ndarray:
        return self.model_step_time_s(workers, local_batch) - self.compute_time_s(workers, local_batch)

    def step_time_interval_s(self, workers, local_batch, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
        """95 % prediction interval of a step: the compute and step fits' half-widths in quadrature."""
        t = self.step_time_s(workers, local_batch)
        half = self.compute.half_width(self._cx(workers, local_batch), alpha)
        if self.step is not None:
            X = self._sx(workers, local_batch)
            half = np.sqrt(half**2 + np.where(X["n"] <= 1, 0.0, self.step.half_width(X, alpha)) ** 2)
        floor = self.input_time_s(workers, local_batch)
        return np.maximum(np.maximum(t - half, 0.0), floor), np.maximum(t + half, floor)

    def to_dict(self) -> dict[str, Any]:
        return {
            "equation": "step_time_s = max(compute(b, N) (+) sync(N), input(b, g)), forms chosen by held-out error  (Eq. 2 "
                        "with the input pipeline's floor)",
            "collective": self.collective,
            "sync_term": COLLECTIVE_TERMS[self.collective][0],
            "workers_per_node": self.workers_per_node,
            "compute": self.compute.to_dict(),
            "step": self.step.to_dict() if self.step is not None else None,
            "input": self.input.to_dict() if self.input is not None else None,
            "residuals": list(self.residuals),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PerfModel":
        try:
            return cls(d["collective"], _fitted(d["compute"], COMPUTE_FORMS[d["compute"]["form"]]),
                       _fitted(d["step"], _step_form(d["step"]["form"], d["collective"])) if d.get("step") else None,
                       tuple(d.get("residuals", ())), int(d.get("workers_per_node", 1)),
                       _fitted(d["input"], INPUT_FORMS[d["input"]["form"]]) if d.get("input") else None)  # fmt: skip
        except KeyError as exc:
            raise ValueError(f"perf.json: missing {exc}; re-run `tula fit`") from None


def _fitted(d: dict[str, Any], form: Form) -> Fitted:
    return Fitted(form, tuple(d["params"][p] for p in form.params), tuple(tuple(r) for r in d["cov"]),
                  float(d["sigma_rel"]), int(d["dof"]), int(d["n_points"]),
                  {k: d[k] for k in ("criterion", "cross_validation", "candidates", "why", "interval_from") if k in d})  # fmt: skip


def fit(measurements: pd.DataFrame, collective: str, workers_per_node: int = 1) -> PerfModel:
    """Choose and fit the compute and step forms on the ok rows; a job of N workers ran on
    ceil(N / workers_per_node) nodes (a ``nodes`` column, where the measurements have one,
    must agree: the model predicts the layout the probes measured)."""
    if collective not in COLLECTIVE_TERMS:
        raise ValueError(f"config key 'hardware.collective': unknown collective {collective!r}")
    ok = measurements[measurements["status"] == "ok"]
    comp = ok[np.isfinite(pd.to_numeric(ok["compute_time_s"], errors="coerce")) & (ok["compute_time_s"] > 0)]
    if comp.empty:
        raise ValueError("step-time model: no successful compute-time measurement to fit")
    Xc = {"b": comp["local_batch"].to_numpy(float), "n": comp["workers"].to_numpy(float)}
    forms = compute_forms(float(Xc["b"].max()))
    if len(np.unique(Xc["n"])) < 2:
        forms = [f for f in forms if not f.name.endswith("_shared")]  # one N: sharing cannot be seen
    compute = curvefit.choose(forms, Xc, comp["compute_time_s"].to_numpy(float), "compute model")
    probes = ok[(ok["source"] == "probe") if "source" in ok.columns else slice(None)]
    probes = probes[np.isfinite(pd.to_numeric(probes["step_time_s"], errors="coerce")) & (probes["step_time_s"] > 0)]
    _check_layout(probes, workers_per_node)
    floor = fit_input(probes, workers_per_node)
    model = PerfModel(collective, compute, None, workers_per_node=workers_per_node, input=floor)
    multi = probes[probes["workers"] > 1]
    if len(multi):
        n = multi["workers"].to_numpy(float)
        X = model._sx(n, multi["local_batch"].to_numpy(float))
        latency = probes["workers"].nunique() >= 3 and len(np.unique(n)) >= 2 and collective != "tree"
        forms = step_forms(collective, False) + (step_forms(collective, True) if latency else [])
        if (X["multi"] > 0).any() and ((X["multi"] == 0) & (X["n"] > 1)).any():
            forms += two_level_forms(collective)  # both sides of a node boundary were measured
        forms.sort(key=lambda f: len(f.params))
        noise = pd.to_numeric(multi["step_time_cv"], errors="coerce").to_numpy(float) if "step_time_cv" in multi else None
        step = curvefit.choose(forms, X, multi["step_time_s"].to_numpy(float), "step model", noise)
        model = PerfModel(collective, compute, step, workers_per_node=workers_per_node, input=floor)
    return PerfModel(collective, compute, model.step, tuple(residuals(model, probes)), workers_per_node, floor)


def _check_layout(probes: pd.DataFrame, workers_per_node: int) -> None:
    if "nodes" not in probes.columns:
        return
    nodes = pd.to_numeric(probes["nodes"], errors="coerce")
    expect = nodes_of(probes["workers"].to_numpy(float), workers_per_node)
    bad = nodes.notna() & (nodes.to_numpy(float) != expect)
    if bad.any():
        r = probes[bad].iloc[0]
        raise ValueError(f"measurements: the probe of N={int(r['workers'])} ran on {int(r['nodes'])} node(s), but "
                         f"cluster.workers_per_node={workers_per_node} puts it on {int(expect[bad.to_numpy()][0])}: "
                         "the model would predict another layout than the one measured; set "
                         "cluster.workers_per_node to the probes' (or probe again)")  # fmt: skip


def residuals(model: PerfModel, probes: pd.DataFrame) -> list[dict[str, Any]]:
    """Each probe's measured step time beside the model's, and its own step-to-step noise."""
    out = []
    pred = model.step_time_s(probes["workers"].to_numpy(float), probes["local_batch"].to_numpy(float))
    for (_, r), p in zip(probes.iterrows(), pred):
        err = 100.0 * (p - r["step_time_s"]) / r["step_time_s"]
        cv = r.get("step_time_cv")
        noise = 100.0 * float(cv) if cv is not None and np.isfinite(cv) else None
        out.append({"workers": int(r["workers"]), "nodes": int(nodes_of(r["workers"], model.workers_per_node)),
                    "global_batch": int(r["global_batch"]), "measured_step_time_s": float(r["step_time_s"]), "predicted_step_time_s": float(p),
                    "error_pct": float(err), "noise_pct": noise,
                    "input_bound": bool(model.input_bound(r["workers"], r["local_batch"])),
                    "within_noise": None if noise is None else bool(abs(err) <= noise)})  # fmt: skip
    return out


def evaluation_time(row):
    """The run's evaluation: its first pass, then one later pass per further epoch (a
    predictions.csv row, or the frame)."""
    return row["eval_first_time_s"] + (row["epochs"] - 1) * row["eval_time_s"]
