"""The input pipeline's floor under the step time: a step can go no faster than its input.

The probe reads its input pipeline alone (loader workers, the copy to the device, no model)
at its local batch b; its time per batch is fitted here, among these forms by held-out error,
simplest first (inputs b: local batch, n: workers on one node, whose loader workers share
the node's cores):

    per_sample      i1*b
    linear          i0 + i1*b
    linear_shared   (i0 + i1*b) * (1 + k*(g-1))    g workers on a node slow each other's input

:class:`tula.model.perf.PerfModel` takes the larger of the compute-and-sync step and this floor.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tula.model import formchoice
from tula.model.curvefit import Fitted, Form
from tula.model.grid import nodes_of

INF = np.inf


def _linear(th, X):
    return th[0] + th[1] * X["b"]


def _shared(th, X):
    return _linear(th, X) * (1.0 + th[2] * (X["n"] - 1.0))


def _starts(X, y):
    per_sample = max(float(np.mean(y / X["b"])), 1e-12)
    if np.ptp(X["b"]) > 0:
        slope, icept = np.polyfit(X["b"], y, 1)
        return [np.array([max(icept, 0.0), max(slope, 1e-12)]), np.array([0.0, per_sample])]
    return [np.array([0.0, per_sample])]


def input_forms() -> list[Form]:
    return [
        Form(
            "per_sample",
            ("i1",),
            lambda th, X: th[0] * X["b"],
            (0,),
            (INF,),
            lambda X, y: [np.array([max(float(np.mean(y / X["b"])), 1e-12)])],
            "i1*b",
        ),
        Form("linear", ("i0", "i1"), _linear, (0, 0), (INF, INF), _starts, "i0 + i1*b"),
        Form(
            "linear_shared",
            ("i0", "i1", "k"),
            _shared,
            (0, 0, 0),
            (INF, INF, 10),
            lambda X, y: [np.append(s, k) for s in _starts(X, y) for k in (0.0, 0.5)],
            "(i0 + i1*b) * (1 + k*(g-1)), g workers on a node",
        ),
    ]


INPUT_FORMS = {f.name: f for f in input_forms()}


def fit_input(probes: pd.DataFrame, workers_per_node: int) -> Fitted | None:
    """The floor fitted on the probes' ``input_time_s`` (None: no probe measured it)."""
    if "input_time_s" not in probes.columns:
        return None
    t = pd.to_numeric(probes["input_time_s"], errors="coerce")
    rows = probes[np.isfinite(t) & (t > 0)]
    if rows.empty:
        return None
    n = rows["workers"].to_numpy(float)
    X = {"b": rows["local_batch"].to_numpy(float), "n": n / nodes_of(n, workers_per_node)}
    forms = [
        f for f in input_forms() if len(np.unique(X["n"])) > 1 or not f.name.endswith("_shared")
    ]
    return formchoice.choose(
        forms, X, pd.to_numeric(rows["input_time_s"]).to_numpy(float), "input floor"
    )
