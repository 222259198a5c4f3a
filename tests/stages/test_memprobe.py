"""The memory probe (tula.stages.memprobe, and its worker tula.runtime.probe.memprobe_worker): one
real worker's peaks at a few local batches, b_max, and the measurement at the b_max it predicts."""

import pytest

from tula import config, model_inputs


@pytest.mark.probe
def test_memory_probe_gives_b_max_and_the_search_set_stays_below_it(tiny_raw, tmp_path, venv_path):
    """One real worker at a few local batches; with a 9 MB device (8.1 MB after the 10 % margin)
    small_cnn fits b=64 (7.1 MiB measured, AGS's per-parameter factors included) but not b=128
    (12.2 MiB): a partial search of one batch a step then probes N=1 at B=64 instead of
    B=128; under train.accumulate: auto it probes B=128 too, as two micro-batches."""
    import dataclasses
    import json

    import yaml

    from tula.model.grid import Point, search_set
    from tula.model.memory import MemoryModel, max_local_batch
    from tula.stages import memprobe

    tiny_raw["hardware"] = {"device_memory_gb": 0.009}
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml.safe_dump(tiny_raw))
    out = tmp_path / "memory_probe.json"
    rec = memprobe.run(cfg_file, out)
    assert (
        json.loads(out.read_text())["max_local_batch"]
        == rec["max_local_batch"]
        == max_local_batch(out)
    )
    pts = rec["points"]
    assert [p["local_batch"] for p in pts] == [16, 64, 128] and all(
        p["status"] == "ok" for p in pts
    )
    assert all(
        p["peak_mem_bytes"] == max(p["plain_peak_bytes"], p["refresh_peak_bytes"]) for p in pts
    )
    model = MemoryModel.from_dict(rec["memory_model"])
    bmax = rec["max_local_batch"]
    assert 64 <= bmax < 128
    budget = config.load(cfg_file).hardware.memory_budget_bytes
    assert model.predict_bytes(bmax) <= budget < model.predict_bytes(bmax + 1)
    cfg = config.load(cfg_file)
    one_batch = [Point(1, 32), Point(1, 64), Point(2, 32), Point(2, 128)]
    one = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, accumulate=1))
    assert search_set(model_inputs.grid_spec(one), bmax) == one_batch
    # train.accumulate: auto (the default): N = 1 at B = 128 too, as two micro-batches
    assert search_set(model_inputs.grid_spec(cfg), bmax) == sorted([*one_batch, Point(1, 128)])
    assert not list(tmp_path.glob(".*ranks"))


def test_the_memory_probe_measures_at_the_b_max_it_predicts():
    from tula.model.memory import next_probe_batch as next_batch
    from tula.model.memory import probe_batches as default_batches

    cfg = config.from_dict(
        {
            "grid": {"workers": [1, 2], "batch_min": 32, "batch_max": 1024},
            "hardware": {"device_memory_gb": (1000 + 100 * 700) / 0.9 / 1e9},
        }
    )
    g, budget = model_inputs.grid_spec(cfg), cfg.hardware.memory_budget_bytes
    first = default_batches(g)
    assert first == [16, 64, 256]
    pts = [{"local_batch": b, "status": "ok", "peak_mem_bytes": 1000 + 100 * b} for b in first]
    # the largest grid local batch under the predicted b_max = 700
    assert next_batch(g, None, budget, pts) == 512
    oom = pts + [{"local_batch": 512, "status": "oom"}]
    assert next_batch(g, None, budget, oom) is None  # below the OOM, 256 is the largest: measured
    ran = pts + [{"local_batch": 512, "status": "ok", "peak_mem_bytes": 1000 + 100 * 512}]
    assert next_batch(g, None, budget, ran) is None


@pytest.mark.probe
def test_a_batch_the_estimate_rules_out_is_not_measured_and_the_estimate_is_checked(
    tiny_raw, tmp_path, venv_path
):
    """tula check's estimate (the step under FakeTensorMode) with a budget that fits local batch
    ~100: b=256 is over it by far more than the 25 % margin, so the memory probe does not buy a
    step to watch it run out of memory; it measures 16 and 64, writes how far the estimate was
    from each, and the search set never reaches b=256. measurements.csv carries the errors."""
    import yaml

    from tula.io import read_json
    from tula.model import estimated
    from tula.model.grid import search_set
    from tula.stages import aggregate, check, memprobe

    tiny_raw["grid"]["batch_max"] = 256
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml.safe_dump(tiny_raw))
    workload = tmp_path / "workload.json"
    check.run(cfg_file, workload)
    est = read_json(workload)["estimate"]
    assert est["device"] == "cpu" and est["batches"] == [16, 256]
    budget = estimated.predict_bytes(est, 100)
    tiny_raw["hardware"] = {"device_memory_gb": budget / 0.9 / 1e9}
    cfg_file.write_text(yaml.safe_dump(tiny_raw))
    assert estimated.clearly_out(est, budget, 256) and not estimated.clearly_out(est, budget, 64)

    out = tmp_path / "memory_probe.json"
    rec = memprobe.run(cfg_file, out, workload=workload)
    assert [p["local_batch"] for p in rec["points"]] == [16, 64]
    assert [r["local_batch"] for r in rec["estimate"]["ruled_out"]] == [256]
    check_ = rec["estimate"]["against_probe"]
    for r, p in zip(check_["points"], rec["points"]):
        assert r["measured_bytes"] == p["peak_mem_bytes"]
        assert r["error"] == pytest.approx(
            estimated.predict_bytes(est, p["local_batch"]) / r["measured_bytes"] - 1
        )
    assert check_["error_at_largest"] == check_["points"][-1]["error"]
    bmax = rec["max_local_batch"]
    assert 64 <= bmax < 256
    assert all(
        p.local_batch < 256 for p in search_set(model_inputs.grid_spec(config.load(cfg_file)), bmax)
    )

    probe = tmp_path / "N1_B32.json"  # one probe row, so that aggregate has a probe file
    probe.write_text(
        '{"workers": 1, "global_batch": 32, "local_batch": 32, "status": "oom", "error": "x"}'
    )
    df = aggregate.run([probe], tmp_path / "m.csv", memory_probe=out)
    mem = df[df["source"] == "memory"]
    assert list(mem["estimate_mem_error"]) == pytest.approx([r["error"] for r in check_["points"]])
    assert mem["estimate_mem_bytes"].notna().all()
