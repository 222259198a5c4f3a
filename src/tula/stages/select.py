"""``tula select``: read the config and predictions.csv, write selection.json. The choice
itself (objectives, constraints, the knee, the re-plan on drift) is :mod:`tula.model.choice`;
how firmly the probes' noise holds it (the choice made again on resamples of their timings)
is :mod:`tula.model.robust`, given the measurements and the fitted models."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from tula import config as config_mod
from tula import model_inputs
from tula.io import read_json, write_json
from tula.model import across, robust
from tula.model import measurements as measurements_mod
from tula.model.choice import select
from tula.model.memory import MemoryModel
from tula.model.perf import PerfModel
from tula.model.selection import Point, Selection


def _robustness(
    sel: Selection, pred: pd.DataFrame, cfg, measurements, perf, memory, waits
) -> Selection:
    """The choice over resamples of the probes' timings; where most resamples choose another
    point than the measured means do, that point (the rule in :mod:`tula.model.robust`). An
    unsettled choice is said by ``robustness`` (the report's line, the log's bracket)."""
    measured = measurements_mod.load(measurements)
    perf_m = PerfModel.from_dict(read_json(perf))
    inflate = robust.scatter_ratio(measured, perf_m)
    shares = robust.choice_shares(
        model_inputs.planning(cfg),
        measured,
        perf_m,
        MemoryModel.from_dict(read_json(memory)),
        _train_samples(measured, pred),
        inflate=inflate,
        waits=waits,
    )
    r = robust.verdict(sel.selected, shares, robust.RESAMPLES, cfg.probe.precision, inflate)
    sel = replace(sel, robustness=r)
    if r.chosen.key == sel.point:
        return sel
    n, b = r.chosen.key
    row = pred[(pred["workers"] == n) & (pred["global_batch"] == b)].iloc[0]
    return replace(
        sel,
        runner_up=sel.selected,
        selected=Point.of_row(row, cfg.pricing.currency),
        reason=(
            f"N={n} B={b} is chosen in {100 * r.chosen.share:.0f} % of {r.resamples} resamples "
            f"of the probes' timings, N={sel.point[0]} B={sel.point[1]} (the measured means' "
            f"choice: {sel.reason}) in {100 * r.point_estimate.share:.0f} %"
        ),
    )


def _train_samples(measured: pd.DataFrame, pred: pd.DataFrame) -> int:
    """D, as predict took it: the probes' record, else one epoch's steps at the smallest B."""
    if "train_samples" in measured.columns and measured["train_samples"].notna().any():
        return int(measured["train_samples"].dropna().iloc[0])
    row = pred.sort_values("global_batch").iloc[0]
    return int(row["steps_per_epoch"] * row["global_batch"])


def run(
    config, predictions, out, measurements=None, perf=None, memory=None, queue=None
) -> Selection:
    """``tula select``: read the config and predictions.csv, write selection.json; with the
    measurements and the fitted models, also how firmly the probes' noise holds the choice;
    with ``queue`` (queue.json of ``tula queue``), each point's expected wait, which objective
    time_to_result adds to T."""
    cfg = config_mod.load(config)
    pred = pd.read_csv(predictions)
    asked = read_json(queue) if queue else None
    waits = across.waits_by_workers(asked) if asked else {}
    if waits:  # none known (no queue, SLURM silent): the choice is by T alone, and says so
        pred = across.with_waits(pred, waits)
    sel = select(pred, model_inputs.planning(cfg))
    if asked:
        sel = replace(sel, queue=asked)
    if measurements and perf and memory:
        sel = _robustness(sel, pred, cfg, measurements, perf, memory, waits)
    write_json(out, sel.to_json())
    s, held = sel.selected, sel.robustness
    print(
        f"[select] objective {sel.objective}: N={s.workers} B={s.global_batch} — "
        f"{sel.reason}"
        + (
            f" [{100 * held.chosen.share:.0f} % of {held.resamples} resamples"
            + ("" if held.settled else ", not settled")
            + "]"
            if held
            else ""
        )
        + f" -> {out}"
    )
    return sel
