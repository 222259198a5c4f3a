"""Real multi-process runs: torchrun, 2 gloo workers, a real DDP model."""

import json

import pandas as pd
import pytest

from tula import probe, train
from tula.io import write_json


def test_two_process_gloo_probe(tiny_config_file, tmp_path, venv_path):
    out = tmp_path / "probes" / "N2_B64.json"
    rec = probe.run(tiny_config_file, 2, 64, out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(rec))
    assert rec["status"] == "ok", rec.get("error")
    assert rec["local_batch"] == 32 and rec["env"]["world_size"] == 2 and rec["env"]["backend"] == "gloo"
    assert len(rec["env"]["hostnames"]) == 2
    assert 0 < rec["compute_time_s"] and 0 < rec["step_time_s"] and rec["sync_time_s"] >= 0
    assert len(rec["step_times_s"]) == 3 and rec["step_time_iqr_s"] >= 0
    mem = rec["memory"]
    assert mem["act_bytes"] > 0 and mem["grad_bytes"] == mem["param_bytes"] == rec["grad_bytes_per_step"]
    assert mem["opt_bytes"] == mem["param_bytes"]  # SGD momentum: one buffer per parameter
    assert mem["batch_bytes"] == 32 * 64 * 4 + 32 * 8  # float32 8x8 images + int64 labels
    # measured peak (profiler timeline + persistent tensors) covers the Eq. 3 terms, plus transients
    assert mem["model_total_bytes"] <= rec["peak_mem_bytes"] <= 1.5 * mem["model_total_bytes"]
    assert not (out.parent / ".N2_B64.ranks").exists()


def test_activation_memory_grows_linearly_with_batch(tiny_config_file, tmp_path, venv_path):
    a = probe.run(tiny_config_file, 1, 32, tmp_path / "a.json")["memory"]["act_bytes"]
    b = probe.run(tiny_config_file, 1, 64, tmp_path / "b.json")["memory"]["act_bytes"]
    assert b == pytest.approx(2 * a, rel=0.01)


def test_oom_on_one_rank_is_recorded_not_raised(tiny_config_file, tmp_path, venv_path, monkeypatch):
    monkeypatch.setenv(probe.FAULT_ENV, "N2_B64=oom")
    rec = probe.run(tiny_config_file, 2, 64, tmp_path / "N2_B64.json")
    assert rec["status"] == "oom" and "rank 1" in rec["error"]
    assert "step_time_s" not in rec


def test_worker_error_is_recorded(tiny_raw, tmp_path, venv_path):
    import torch
    import yaml

    if torch.cuda.is_available():
        pytest.skip("this failure needs a machine without CUDA")
    tiny_raw["hardware"] = {"device": "cuda", "backend": "gloo"}
    cfg = tmp_path / "cuda.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw))
    rec = probe.run(cfg, 1, 32, tmp_path / "N1_B32.json")
    assert rec["status"] == "error"
    assert "hardware.device" in rec["error"] and "no CUDA device" in rec["error"]
    assert json.loads((tmp_path / "N1_B32.json").read_text())["status"] == "error"


def test_two_process_training(tiny_config_file, tmp_path, venv_path):
    sel = tmp_path / "selection.json"
    write_json(sel, {"selected": {"nodes": 2, "global_batch": 64}})
    final = train.run(tiny_config_file, sel, tmp_path / "train")
    m = pd.read_csv(tmp_path / "train" / "metrics.csv")
    assert list(m["epoch"]) == [1, 2] and list(m.columns) == train.METRIC_COLUMNS
    assert final["steps"] == 2 * train.steps_per_epoch(1437, 64)
    assert m["train_loss"].iloc[-1] < m["train_loss"].iloc[0]
    assert final["final_test_acc"] > 0.5  # digits, 2 epochs: far above 10 % chance


def test_training_failure_raises_and_writes_no_final(tiny_raw, tmp_path, venv_path):
    import yaml

    tiny_raw["workload"]["dataset"] = f"npz:{tmp_path / 'missing.npz'}"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw))
    sel = tmp_path / "selection.json"
    write_json(sel, {"selected": {"nodes": 1, "global_batch": 32}})
    previous = tmp_path / "train" / "final.json"
    write_json(previous, {"from": "an earlier good run"})
    with pytest.raises(RuntimeError, match="training at N=1 B=32 failed"):
        train.run(cfg, sel, tmp_path / "train")
    assert json.loads(previous.read_text()) == {"from": "an earlier good run"}  # nothing lost
