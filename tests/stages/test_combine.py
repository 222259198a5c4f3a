"""`tula combine` on two partitions' own results: the queue's waits each choice was made with
count in time_to_result across them, and the chosen partition's files go where the stages
after select read them."""

import json

import pandas as pd
import yaml

from conftest import prediction_table
from tula import config, model_inputs
from tula.io import write_json
from tula.model import across
from tula.model.choice import select
from tula.model.measurements import REQUIRED
from tula.stages import combine

TIMES = {(1, 64): 400.0, (2, 64): 300.0, (2, 128): 200.0}


def partition(root, name, scale, waits, cfg):
    """results/partitions/<name>/ as that partition's own stages leave it."""
    d = root / "partitions" / name
    (d / "model").mkdir(parents=True)
    pred = prediction_table({k: v * scale for k, v in TIMES.items()})
    pred.to_csv(d / "predictions.csv", index=False)
    queue = {"partition": name, "waits": [{"workers": n, "wait_s": w} for n, w in waits.items()]}
    write_json(
        d / "selection.json",
        {
            **select(across.with_waits(pred, waits), model_inputs.planning(cfg)).to_json(),
            "queue": queue,
        },
    )
    probes = pred.assign(
        compute_time_s=pred["step_time_s"], sync_time_s=0.0, peak_mem_bytes=1e6, status="ok"
    )
    probes[list(REQUIRED)].to_csv(d / "measurements.csv", index=False)
    for f in ("model/memory.json", "model/perf.json", "workload.json", "memory_probe.json"):
        write_json(d / f, {"partition": name})
    write_json(root / "snapshots" / f"{name}.json", {"partition": name})
    return f"{name}={d}"


def test_time_to_result_counts_the_waits_and_the_chosen_files_take_the_plain_places(tmp_path):
    raw = {"objective": "time_to_result", "cluster": {"partitions": [{"name": "a"}, {"name": "b"}]}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    cfg = config.from_dict(raw)
    res = tmp_path / "results"
    # a is twice as fast, but waits 1000 s for any shape; b starts now
    parts = [
        partition(res, "a", 1.0, {1: 1000.0, 2: 1000.0}, cfg),
        partition(res, "b", 2.0, {1: 0.0, 2: 0.0}, cfg),
    ]
    sel = combine.run(tmp_path / "c.yaml", parts, str(res / "snapshots"), str(res))
    assert sel.partition == "b" and sel.across_partitions.runner_up.partition == "a"
    assert sel.across_partitions.partitions[1].value == 1200.0  # a: 1000 s + 200 s
    spanning = pd.read_csv(res / "partitions" / "predictions.csv")
    assert set(spanning["partition"]) == {"a", "b"} and spanning["queue_wait_s"].notna().all()
    assert json.loads((res / "workload.json").read_text()) == {"partition": "b"}
    assert json.loads((res / "partitions" / "chosen.json").read_text()) == {"partition": "b"}
    pd.testing.assert_frame_equal(
        pd.read_csv(res / "predictions.csv"), pd.read_csv(res / "partitions/b/predictions.csv")
    )


def test_a_table_of_one_keeps_its_own_choice_byte_for_byte(tmp_path):
    """One partition (a config without cluster.partitions): nothing across to choose, so
    results/selection.json is that partition's own, and its files take the same places."""
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"objective": "time"}))
    cfg = config.from_dict({"objective": "time"})
    res = tmp_path / "results"
    part = partition(res, "default", 1.0, {}, cfg)
    sel = combine.run(tmp_path / "c.yaml", [part], str(res / "snapshots"), str(res))
    own = res / "partitions" / "default"
    assert (res / "selection.json").read_bytes() == (own / "selection.json").read_bytes()
    assert sel.partition is None and sel.across_partitions is None
    assert json.loads((res / "partitions" / "chosen.json").read_text()) == {"partition": "default"}
    for f in combine.CHOSEN_FILES:
        assert (res / f).read_bytes() == (own / f).read_bytes(), f
    spanning = pd.read_csv(res / "partitions" / "predictions.csv")
    assert set(spanning["partition"]) == {"default"} and len(spanning) == len(TIMES)
