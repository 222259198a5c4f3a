"""The command line (tula.cli): one subcommand per stage module, each with its help; a user
mistake is one line on stderr and exit code 2; the contract of measurements taken elsewhere."""

import re
import subprocess
import sys

import pytest

import bounds
from conftest import ROOT
from tula.cli import main

STAGES_DIR = ROOT / "src" / "tula" / "stages"
STAGE_MODULES = sorted(  # a stage is a module, or a package (report: its page and sections)
    [f.stem for f in STAGES_DIR.glob("*.py") if f.stem != "__init__"]
    + [d.name for d in STAGES_DIR.iterdir() if (d / "__init__.py").exists()]
)
SUB_ACTIONS = {"plot": ["selection", "training", "partitions"], "compare": ["run", "aggregate"]}


def test_every_stage_module_is_a_subcommand_of_the_same_name():
    """rule = verb = module: `tula --help` lists a subcommand for each module of tula/stages/
    (and `models`, which lists the model names), nothing else."""
    r = subprocess.run([sys.executable, "-m", "tula.cli", "--help"], capture_output=True, text=True)
    listed = re.findall(
        r"^    (\w+)", r.stdout.split("positional arguments:")[1].split("options:")[0], flags=re.M
    )
    assert r.returncode == 0 and sorted(listed) == sorted([*STAGE_MODULES, "models"])
    assert STAGE_MODULES == [
        "aggregate",
        "check",
        "combine",
        "compare",
        "fit",
        "launch",
        "memprobe",
        "plan",
        "plot",
        "predict",
        "probe",
        "queue",
        "report",
        "select",
        "summary",
    ]


@pytest.mark.parametrize(
    "argv",
    [[s] for s in [*STAGE_MODULES, "models"]]
    + [[s, a] for s, actions in SUB_ACTIONS.items() for a in actions],
)
def test_every_subcommand_has_its_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("usage: tula " + " ".join(argv))


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "tula.cli", "models"], capture_output=True, text=True)
    assert r.returncode == 0 and "small_cnn" in r.stdout.split()


def test_user_error_is_one_clear_line(tmp_path, capsys):
    bad = tmp_path / "c.yaml"
    bad.write_text("grid:\n  workers: [0]\n")
    assert main(["check", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "config key 'grid.workers.0'" in err and "Traceback" not in err


def test_fit_on_all_failed_probes_says_so(tmp_path, capsys, tiny_config_file):
    m = tmp_path / "m.csv"
    m.write_text(
        "workers,global_batch,local_batch,step_time_s,compute_time_s,sync_time_s,peak_mem_bytes,status\n"
        "1,32,32,,,,,oom\n"
    )
    assert (
        main(
            [
                "fit",
                "--config",
                str(tiny_config_file),
                "--measurements",
                str(m),
                "--memory-out",
                str(tmp_path / "memory.json"),
                "--perf-out",
                str(tmp_path / "perf.json"),
            ]
        )
        == 2
    )
    assert "no probe succeeded" in capsys.readouterr().err
    assert not (tmp_path / "perf.json").exists() and not (tmp_path / "memory.json").exists()


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
            rows.append(
                dict(
                    workers=n,
                    global_batch=B,
                    local_batch=b,
                    step_time_s=comp + sync,
                    compute_time_s=comp,
                    sync_time_s=sync,
                    peak_mem_bytes=2e9 + 3e7 * b,
                    status="ok",
                )
            )
    pd.DataFrame(rows).to_csv(tmp_path / "m.csv", index=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "grid": {"workers": [2, 4, 8, 16], "batch_min": 64, "batch_max": 1024},
                "hardware": {"device_memory_gb": 32},
                "objective": "time",
            }
        )
    )
    c, m, md = str(cfg), str(tmp_path / "m.csv"), tmp_path / "model"
    mem, perf = str(md / "memory.json"), str(md / "perf.json")
    assert (
        main(["fit", "--config", c, "--measurements", m, "--memory-out", mem, "--perf-out", perf])
        == 0
    )
    assert (
        main(
            [
                "predict",
                "--config",
                c,
                "--measurements",
                m,
                "--memory",
                mem,
                "--perf",
                perf,
                "--train-samples",
                "50000",
                "--out",
                str(tmp_path / "p.csv"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "select",
                "--config",
                c,
                "--predictions",
                str(tmp_path / "p.csv"),
                "--out",
                str(tmp_path / "s.json"),
            ]
        )
        == 0
    )
    pred = pd.read_csv(tmp_path / "p.csv")
    assert len(pred) == 4 * 5 and (pred["step_time_lo_s"] <= pred["step_time_s"]).all()
    perf = json.loads((tmp_path / "model" / "perf.json").read_text())
    assert perf["compute"]["form"] == "linear"  # exact linear data: the simplest form wins
    # exact data, exact recovery
    assert perf["compute"]["params"]["c1"] == pytest.approx(0.0004, rel=1e-6)
    # near every probe (the data's sync has a constant s(N) lacks)
    assert all(abs(r["error_pct"]) / 100 < bounds.SCIPY_DRIFT for r in perf["residuals"])
    assert json.loads((tmp_path / "s.json").read_text())["selected"]["workers"] in (2, 4, 8, 16)
