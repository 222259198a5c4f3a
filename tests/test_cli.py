import subprocess
import sys

import pytest

from tula.cli import build_parser, main

STAGES = ["probe", "aggregate", "fit", "predict", "select", "plot", "train", "report"]


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_has_help(stage, capsys):
    with pytest.raises(SystemExit) as e:
        main([stage, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--" in out and "usage: tula " + stage in out


def test_every_data_flow_arrow_is_a_subcommand():
    sub = next(a for a in build_parser()._actions if a.dest == "stage")
    assert set(STAGES) <= set(sub.choices)


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "tula.cli", "models"], capture_output=True, text=True)
    assert r.returncode == 0 and "small_cnn" in r.stdout.split()


def test_user_error_is_one_clear_line(tmp_path, capsys):
    bad = tmp_path / "c.yaml"
    bad.write_text("grid:\n  nodes: [0]\n")
    assert main(["check", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "config key 'grid.nodes.0'" in err and "Traceback" not in err


def test_fit_on_all_failed_probes_says_so(tmp_path, capsys, tiny_config_file):
    m = tmp_path / "m.csv"
    m.write_text("nodes,global_batch,local_batch,step_time_s,compute_time_s,sync_time_s,peak_mem_bytes,status\n"
                 "1,32,32,,,,,oom\n")  # fmt: skip
    assert main(["fit", "--config", str(tiny_config_file), "--measurements", str(m), "--memory-out",
                 str(tmp_path / "memory.json"), "--perf-out", str(tmp_path / "perf.json")]) == 2  # fmt: skip
    assert "no probe succeeded" in capsys.readouterr().err
    assert not (tmp_path / "perf.json").exists() and not (tmp_path / "memory.json").exists()


def test_check_lists_the_search_set(tiny_config_file, capsys):
    assert main(["check", "--config", str(tiny_config_file)]) == 0
    assert "N1_B32, N1_B128, N2_B32, N2_B128" in capsys.readouterr().out


def test_fit_predict_select_on_measurements_taken_elsewhere(tmp_path, capsys):
    """The measurements.csv contract: GPU-cluster numbers, no probe, no train_samples column."""
    import json

    import pandas as pd
    import yaml

    rows = []
    for n in (2, 4, 8, 16):
        for B in (64, 1024):  # partial search: only the extremes were measured
            b = B // n
            comp, sync = 0.01 + 0.0004 * b, 0.0 if n == 1 else 0.002 + 0.06 * (n - 1) / n
            rows.append(dict(nodes=n, global_batch=B, local_batch=b, step_time_s=comp + sync, compute_time_s=comp,
                             sync_time_s=sync, peak_mem_bytes=2e9 + 3e7 * b, status="ok"))  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "m.csv", index=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"grid": {"nodes": [2, 4, 8, 16], "batch_min": 64, "batch_max": 1024},
                                   "hardware": {"device_memory_gb": 32}, "objective": "time"}))  # fmt: skip
    c, m, md = str(cfg), str(tmp_path / "m.csv"), tmp_path / "model"
    mem, perf = str(md / "memory.json"), str(md / "perf.json")
    assert main(["fit", "--config", c, "--measurements", m, "--memory-out", mem, "--perf-out", perf]) == 0
    assert main(["predict", "--config", c, "--measurements", m, "--memory", mem, "--perf", perf,
                 "--train-samples", "50000", "--out", str(tmp_path / "p.csv")]) == 0  # fmt: skip
    assert main(["select", "--config", c, "--predictions", str(tmp_path / "p.csv"), "--out", str(tmp_path / "s.json")]) == 0
    pred = pd.read_csv(tmp_path / "p.csv")
    assert len(pred) == 4 * 5 and (pred["step_time_lo_s"] <= pred["step_time_s"]).all()
    perf = json.loads((tmp_path / "model" / "perf.json").read_text())
    assert perf["compute"]["form"] == "linear"  # exact linear data: the simplest form wins
    assert perf["compute"]["params"]["c1"] == pytest.approx(0.0004, rel=1e-6)  # exact data, exact recovery
    assert all(abs(r["error_pct"]) < 2.0 for r in perf["residuals"])  # near every probe (the data's sync has a constant s(N) lacks)
    assert json.loads((tmp_path / "s.json").read_text())["selected"]["nodes"] in (2, 4, 8, 16)


def test_check_config_only_stops_at_a_dataset_file_that_is_not_there(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("workload:\n  dataset: npz:/no/such/file.npz\n")
    assert main(["check", "--config", str(cfg), "--config-only"]) == 2
    captured = capsys.readouterr()
    assert "npz file /no/such/file.npz not found" in captured.err and "valid" not in captured.out
