"""The candidate forms of the step-time model (:mod:`tula.model.perf`), each a
:class:`tula.model.curvefit.Form` with its bounds and starting points, simplest first.

compute, fitted on every compute-only measurement (probe rows and the probe jobs' sweep rows):
    linear              c0 + c1*b
    linear_shared       (c0 + c1*b) * (1 + k*(N-1))        workers share a machine (CPU cores,
                                                           memory bandwidth): each is slower at
                                                           larger N
    linear_shared_parts c0*(1 + k0*(N-1)) + c1*b*(1 + k1*(N-1))   the fixed and the per-sample cost
                                                           slowed by different amounts
    saturating          c0 + c1*max(b - b0, 0)             flat while the device is under-used,
                                                           linear beyond (GPU)
    saturating_shared   the same times (1 + k*(N-1))
step, fitted on the multi-worker probes' step times given the compute model:
    additive            t_compute + s(N)                   exposed sync independent of b
    overlap             (t_compute^g + s(N)^g)^(1/g)       DDP overlaps sync with backward
                                                           (AdaptDL's gamma)
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

"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tula.model.curvefit import Form

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
    return [
        np.array([max(c0, 1e-9), max(c1, 1e-12)]),
        np.array([y.min(), (y.max() - y.min()) / max(np.ptp(X["b"]), 1)]),
    ]


def _sat_starts(X, y):
    bs = np.unique(X["b"])
    out = []
    for b0 in bs[: max(len(bs) - 1, 1)]:
        above = X["b"] > b0
        slope = (
            np.polyfit(X["b"][above], y[above], 1)[0]
            if above.sum() >= 2 and np.ptp(X["b"][above]) > 0
            else 0.0
        )
        out.append(np.array([y[X["b"] <= b0].mean(), max(slope, 1e-12), b0]))
    return out


def _with_k(starts):
    return lambda X, y: [np.append(s, k) for s in starts(X, y) for k in (0.0, 0.5)]


def compute_forms(max_b: float) -> list[Form]:
    return [
        Form("linear", ("c0", "c1"), _lin, (0, 0), (INF, INF), _lin_starts, "c0 + c1*b"),
        Form(
            "linear_shared",
            ("c0", "c1", "k"),
            _shared(_lin, 2),
            (0, 0, 0),
            (INF, INF, 10),
            _with_k(_lin_starts),
            "(c0 + c1*b) * (1 + k*(N-1))",
        ),
        Form(
            "linear_shared_parts",
            ("c0", "c1", "k0", "k1"),
            _lin_parts,
            (0, 0, 0, 0),
            (INF, INF, 10, 10),
            lambda X, y: [np.append(s, [k, k]) for s in _lin_starts(X, y) for k in (0.0, 0.5)],
            "c0*(1 + k0*(N-1)) + c1*b*(1 + k1*(N-1))",
        ),
        Form(
            "saturating",
            ("c0", "c1", "b0"),
            _sat,
            (0, 0, 0),
            (INF, INF, max_b),
            _sat_starts,
            "c0 + c1*max(b - b0, 0)",
        ),
        Form(
            "saturating_shared",
            ("c0", "c1", "b0", "k"),
            _shared(_sat, 3),
            (0, 0, 0, 0),
            (INF, INF, max_b, 10),
            _with_k(_sat_starts),
            "(c0 + c1*max(b - b0, 0)) * (1 + k*(N-1))",
        ),
    ]


# the forms perf.json names, to predict with: a fit bounds b0 by its own rows' largest local
# batch (perf.fit gives a kept form those bounds again)
COMPUTE_FORMS = {f.name: f for f in compute_forms(INF)}


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
        Form(
            f"additive{tag}",
            names,
            _additive(latency),
            (0,) * len(names),
            (INF,) * len(names),
            _step_starts(latency, False),
            f"t_compute + {s}",
        ),
        Form(
            f"overlap{tag}",
            (*names, "gamma"),
            _overlap(latency),
            (0,) * len(names) + (1.0,),
            (INF,) * len(names) + (8.0,),
            _step_starts(latency, True),
            f"(t_compute^gamma + ({s})^gamma)^(1/gamma)",
        ),
    ]


def _two_level_s(th, X):
    return th[0] * X["xg"] + th[1] * X["xk"]


def _bottleneck_s(th, X):
    return (th[0] * (1.0 - X["multi"]) + th[1] * X["multi"]) * X["x"]


def _level_starts(overlap: bool):
    def starts(X, y):
        extra = np.maximum(y - X["c"], 1e-9)
        one, multi = X["multi"] < 0.5, X["multi"] >= 0.5
        s_r = (
            float(np.mean(extra[one] / np.maximum(X["x"][one], 1e-9)))
            if one.any()
            else float(np.mean(extra))
        )
        s_n = float(np.mean(extra[multi] / np.maximum(X["x"][multi], 1e-9))) if multi.any() else s_r
        base = [
            np.array([max(s_r, 1e-9), max(s_n, 1e-9)]),
            np.array([max(s_r, 1e-9) / 2, max(s_n, 1e-9) * 2]),
        ]
        return _with_gamma(base) if overlap else base

    return starts


def two_level_forms(collective: str) -> list[Form]:
    """The sync forms that tell a node's inside from the links between nodes (used when the
    probes saw both: a multi-worker job on one node and one on several)."""
    x = COLLECTIVE_TERMS[collective][0]
    texts = {
        "two_level": f"s_r*{x.replace('N', 'g')} + s_n*{x.replace('N', 'k')}",
        "bottleneck": f"(s_r if k = 1 else s_n)*{x}",
    }
    out = []
    for name, s_of in (("two_level", _two_level_s), ("bottleneck", _bottleneck_s)):
        s = texts[name]
        out += [
            Form(
                f"additive_{name}",
                ("s_r", "s_n"),
                _with_s(s_of, False),
                (0, 0),
                (INF, INF),
                _level_starts(False),
                f"t_compute + {s}",
            ),
            Form(
                f"overlap_{name}",
                ("s_r", "s_n", "gamma"),
                _with_s(s_of, True),
                (0, 0, 1.0),
                (INF, INF, 8.0),
                _level_starts(True),
                f"(t_compute^gamma + ({s})^gamma)^(1/gamma)",
            ),
        ]
    return out


def step_form(name: str, collective: str) -> Form:
    for f in (
        step_forms(collective, False) + step_forms(collective, True) + two_level_forms(collective)
    ):
        if f.name == name:
            return f
    raise ValueError(f"perf.json: unknown step form {name!r}")
