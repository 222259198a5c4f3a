"""The memory probe and the timing probes of a user's own script (examples/ddp_train/train.py):
real processes (torchrun, 2 gloo workers), the script's loop running the steps, the same
probe record as Tula's own loop writes."""

import json

import pytest
import yaml

from conftest import ROOT
from tula.model.probe_record import ProbeRecord
from tula.stages import probe

EXAMPLE = ROOT / "examples" / "ddp_train" / "train.py"
ARGS = "--batch-size {local_batch} --lr {lr} --epochs {epochs} --samples 2000".split()


@pytest.fixture
def script_config(tmp_path):
    raw = {
        "workload": {"script": str(EXAMPLE), "args": ARGS, "epochs": 2},
        "grid": {"workers": [1, 2], "batch_min": 64, "batch_max": 128},
        "search": "full",
        "probe": {"warmup_steps": 2, "timed_steps": 6, "precision": 0.25, "time_budget_s": 2},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.probe
def test_the_scripts_probes_time_both_arms_and_write_tulas_probe_record(script_config, tmp_path):
    job = tmp_path / "probes" / "N2" / "job.json"
    job.parent.mkdir(parents=True)
    records = probe.run_at(script_config, 2, job, None)
    assert sorted(records) == [64, 128]
    assert json.loads(job.read_text())["status"] == {"64": "ok", "128": "ok"}
    for b, raw in records.items():
        rec = ProbeRecord.from_json(raw)
        m, o = rec.measured, rec.result.overheads
        assert rec.ok and rec.probed.model == str(EXAMPLE) and rec.probed.local_batch == b // 2
        assert m.step_time_s > 0 and m.compute_time_s > 0 and m.sync_time_s >= 0
        assert m.timing.step.timed_steps >= 6 and m.timing.compute.timed_steps >= 6
        assert m.timing.precision_target == 0.25 and m.timing.timing_stopped_by
        # 1,600 training samples over 2 workers: DistributedSampler's batches, the loader's length
        assert m.train_samples == 1600 and m.steps_per_epoch == -(-800 // (b // 2))
        assert m.peak_mem_bytes > 0 and m.memory["param_bytes"] > 0
        assert len(m.epoch_start_step_times_s) >= 3  # epochs ended early to reach them
        assert o.startup_time_s > 0 and o.eval_first_time_s > 0 and o.checkpoint_time_s > 0
        assert m.env["workload"] == "script" and m.env["world_size"] == 2
    # the check's phases were said, and each rank wrote its own result: nothing was lost
    assert not any(ProbeRecord.from_json(r).lost_ranks for r in records.values())


@pytest.mark.probe
def test_a_lightning_scripts_probe_times_lightnings_own_steps(tmp_path):
    """examples/lightning_train: the callback marks Lightning's training batches; the probe's
    compute-only step runs under the DDP model Lightning built; Lightning's epochs are not ended
    early, and what follows one (its validation) is what the record calls evaluation."""
    raw = {
        "workload": {"script": str(ROOT / "examples" / "lightning_train" / "train.py")},
        "grid": {"workers": [2], "batch_min": 128, "batch_max": 128},
        "search": "full",
        "probe": {"warmup_steps": 2, "timed_steps": 6, "precision": 0.25, "time_budget_s": 2},
    }
    raw["workload"]["args"] = ARGS
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    job = tmp_path / "probes" / "N2" / "job.json"
    job.parent.mkdir(parents=True)
    (record,) = probe.run_at(tmp_path / "config.yaml", 2, job, None).values()
    rec = ProbeRecord.from_json(record)
    m = rec.measured
    assert rec.ok and m.compute_time_s > 0 and m.timing.compute.timed_steps >= 6
    assert m.train_samples == 1600 and m.steps_per_epoch == 13
    assert rec.result.overheads.eval_first_time_s > 0  # Lightning's validation, timed once
    assert len(m.epoch_start_step_times_s) >= 1
