"""selection.json through its type: read back and written again byte for byte, a key the type
does not know named, and the choice across partitions kept whole."""

import json
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from selections import point, selection
from tula import config, model_inputs
from tula.io import write_json
from tula.model import across
from tula.model.choice import select
from tula.model.selection import Point, Robustness, Selection, Share

H200 = Path(__file__).resolve().parents[2] / "bench" / "gpu-runs" / "h200-2026-11-28" / "results"


def test_the_h200_runs_selection_reads_back_and_writes_the_same_bytes(tmp_path):
    """A selection.json as `tula select` wrote it on the H200 (the knee's block, the runner-up,
    the robustness with its shares) through the type and back: the same file."""
    sel = Selection.read(H200 / "selection.json")
    assert sel.point == (1, 512) and sel.robustness.chosen.key == sel.point
    write_json(tmp_path / "again.json", sel.to_json())
    assert (tmp_path / "again.json").read_bytes() == (H200 / "selection.json").read_bytes()


def test_a_key_the_type_does_not_know_is_named_with_the_file(tmp_path):
    good = json.loads((H200 / "selection.json").read_text())
    for bad, named in (
        ({**good, "chosen_by": "hand"}, "not a selection's key(s): chosen_by"),
        ({**good, "selected": {**good["selected"], "gpu": "h200"}}, "a chosen point's key(s): gpu"),
        ({k: v for k, v in good.items() if k != "selected"}, "missing selected"),
        (
            {**good, "robustness": {**good["robustness"], "votes": 3}},
            "not robustness's key(s): votes",
        ),
    ):
        write_json(tmp_path / "selection.json", bad)
        with pytest.raises(ValueError, match=f"selection.json: .*{re.escape(named)}"):
            Selection.read(tmp_path / "selection.json")


def _planned(scale: float) -> tuple[pd.DataFrame, Selection]:
    rows = [
        dict(workers=n, nodes=1, global_batch=b, local_batch=b // n, feasible=True)
        | dict(step_time_s=scale * t, train_time_s=100 * scale * t, cost=scale * t * n)
        | dict(mem_bytes=1e6, probe_status="ok", accumulate=1)
        for (n, b), t in {(1, 64): 2.0, (2, 64): 1.2, (2, 128): 1.0}.items()
    ]
    pred = pd.DataFrame(rows)
    return pred, select(pred, model_inputs.planning(config.from_dict({"objective": "time"})))


def test_a_choice_across_partitions_reads_back_whole():
    """across.choose's selection with every block `tula combine` adds, and a robustness that
    is not settled: to JSON and back, the same record and the same JSON."""
    (fast_p, fast), (slow_p, slow) = _planned(1.0), _planned(2.0)
    pair = (Share(2, 128, 0.55), Share(2, 64, 0.45))
    held = Robustness(100, "m", 1.5, pair, pair[0], pair[0], pair[1], False, 0.6, "r", "time both")
    fast = replace(fast, robustness=held, queue={"waits": []})
    sel = across.choose({"a": fast_p, "b": slow_p}, {"a": fast, "b": slow}, "time", "time", "USD")
    block = replace(sel.across_partitions, compute_ratios=(), same_gpu=(("a", "b"),), queues={})
    sel = replace(sel, across_partitions=block)
    assert sel.partition == "a" == sel.selected.partition and sel.point == (2, 128)
    assert block.runner_up.partition == "b" and block.runner_up.ratio == 2.0
    text = json.dumps(sel.to_json())
    again = Selection.from_json(json.loads(text))
    assert again == sel and json.dumps(again.to_json()) == text
    keys = list(json.loads(text))
    assert keys == [k for k in Selection.ORDER if k not in ("knee", "noise")]


def test_a_point_writes_its_optional_figures_only_where_it_has_them():
    plain, stepped = point(2, 64).to_json(), point(2, 64, accumulate=4, queue_wait_s=5.0)
    assert "accumulate" not in plain and "queue_wait_s" not in plain and "partition" not in plain
    assert stepped.micro_batches == 4 and stepped.to_json()["queue_wait_s"] == 5.0
    assert selection(2, 64).runner_up is None and "runner_up" in selection(2, 64).to_json()


def test_a_predictions_row_is_probed_where_its_probe_ran_and_accumulates_past_one_batch():
    row = dict(workers=2, nodes=1, global_batch=64, local_batch=32, step_time_s=0.1)
    row |= dict(train_time_s=10.0, cost=1.0, mem_bytes=1e6, accumulate=1, probe_status="ok")
    plain = Point.of_row(pd.Series(row), "USD")
    assert plain.probed and plain.accumulate is None and plain.micro_batches == 1
    stepped = Point.of_row(pd.Series(row | {"accumulate": 4, "probe_status": "failed"}), "USD")
    assert not stepped.probed and stepped.accumulate == 4 and stepped.micro_batches == 4
    assert not Point.of_row(pd.Series(row | {"probe_status": ""}), "USD").probed
    # a predictions.csv with the column but an empty cell (a row written before it): one batch
    empty = Point.of_row(pd.Series(row | {"accumulate": float("nan")}), "USD")
    assert empty.accumulate is None and empty.micro_batches == 1
