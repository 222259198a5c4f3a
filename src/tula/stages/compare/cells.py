"""A cell of the suite (model / dataset / B, method) over its seeds: the test metric's mean and
std, the seeds, and the median time to the workload's target, under ``train.metric``'s name
and goal (:class:`Metric`); what the table and the heatmap both show."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tula.config import TrainSettings, metric_name

METHOD_ORDER = ["lbt", "lars", "polo", "lrs", "static", "ags", "auto"]


@dataclass(frozen=True)
class Metric:
    """How the suite reads ``train.metric``: its name, whether larger is better, and whether it
    is a fraction shown in percent (accuracy, whose differences are points)."""

    name: str = "accuracy"
    goal: str = "max"

    @classmethod
    def of(cls, t: TrainSettings) -> Metric:
        return cls(metric_name(t.metric), t.metric_goal)

    @property
    def percent(self) -> bool:
        return self.name == "accuracy"

    @property
    def scale(self) -> float:
        return 100.0 if self.percent else 1.0

    def best(self, values) -> float:
        return float(np.nanmin(values) if self.goal == "min" else np.nanmax(values))

    def show(self, value: float) -> str:
        """``accuracy 93.42%``, or ``error_rate 0.0658``."""
        return f"{self.name} {value * 100:.2f}%" if self.percent else f"{self.name} {value:.4g}"


def cell_stats(df: pd.DataFrame, metric: Metric = Metric()) -> pd.DataFrame:
    """Per cell: the test metric's mean and std over seeds (in percent for accuracy), the seeds,
    and the median time to target with how many seeds reached it."""
    ok = df[df["status"] == "ok"]
    keys = ["model", "dataset", "global_batch", "method"]
    g = ok.groupby(keys)["test_acc"]
    k = metric.scale
    st = pd.DataFrame({"mean": k * g.mean(), "std": k * g.std(ddof=1).fillna(0.0), "n": g.size()})
    if "time_to_target_s" in ok:
        t = ok.assign(t=median_time_input(ok["time_to_target_s"], ok["target_acc"])).groupby(keys)[
            "t"
        ]
        st["ttt_median"] = t.median()  # inf where most seeds never reached the target
        st["reached"] = ok.groupby(keys)["time_to_target_s"].count()  # NaN: never reached
    return st.reset_index()


def median_time_input(times: pd.Series, target: pd.Series | None = None) -> pd.Series:
    """Times to target ready for a median over seeds: a seed that never reached the target is
    infinitely slow (so a cell whose seeds mostly failed has no median time, and one where 2 of
    3 reached it has the slower of the two); NaN stays NaN only where there was no target."""
    filled = times.astype(float).fillna(np.inf)
    return filled if target is None else filled.where(target.notna())


def methods_in(st: pd.DataFrame) -> list[str]:
    """The methods of these cells, in the paper's order."""
    return [m for m in METHOD_ORDER if m in set(st["method"])]
