"""The fit stage and the stages after it run without torch."""


def test_fit_predict_select_and_report_import_no_torch():
    """The model stages run on a login node without torch being loaded (3.5 s import, GPU libs)."""
    import subprocess
    import sys

    code = (
        "import sys, tula.stages.fit, tula.stages.predict, tula.stages.select, tula.stages.report, "
        "tula.model.memory, tula.model.perf, tula.stages.plot; print(sorted(m for m in sys.modules "
        "if m == 'torch' or m.startswith('torch.')))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def _measurements(tmp_path, n2_status):
    """N = 1 probes and sweep rows that succeeded; the N = 2 probes with ``n2_status``."""
    import pandas as pd

    rows = [
        dict(
            workers=1,
            global_batch=b,
            local_batch=b,
            status="ok",
            source="probe",
            step_time_s=0.01 + 1e-4 * b,
            compute_time_s=0.01 + 1e-4 * b,
            sync_time_s=0.0,
            peak_mem_bytes=1e6 + 1e4 * b,
            step_time_cv=0.01,
        )
        for b in (32, 64, 128, 256)
    ]
    rows += [
        dict(
            workers=2,
            global_batch=b,
            local_batch=b // 2,
            status=n2_status,
            source="probe",
            step_time_s=0.02 + 5e-5 * b if n2_status == "ok" else None,
            compute_time_s=0.01 + 5e-5 * b if n2_status == "ok" else None,
            sync_time_s=0.01 if n2_status == "ok" else None,
            step_time_cv=0.01,
            peak_mem_bytes=1e6 + 1e4 * b // 2 if n2_status == "ok" else None,
            error=None if n2_status == "ok" else "RuntimeError: Connection refused (gloo)",
        )
        for b in (32, 256)
    ]
    path = tmp_path / "measurements.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _config(tmp_path, **probe):
    import yaml

    raw = {"grid": {"workers": [1, 2], "batch_min": 32, "batch_max": 256}, "probe": probe}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    return tmp_path / "c.yaml"


def test_no_multi_worker_probe_stops_the_fit_with_the_probes_own_errors(tmp_path):
    import pytest

    from tula.stages import fit

    meas = _measurements(tmp_path, "error")
    with pytest.raises(ValueError) as err:
        fit.run(_config(tmp_path), meas, tmp_path / "memory.json", tmp_path / "perf.json")
    msg = str(err.value)
    assert "no multi-worker probe succeeded, so nothing measured what communication costs" in msg
    assert (
        "N=2 B=32: error: RuntimeError: Connection refused (gloo)" in msg
        and "N=2 B=256: error:" in msg
    )
    assert "probe.no_sync_fallback: true" in msg and not (tmp_path / "perf.json").exists()


def test_the_fallback_predicts_one_worker_only_and_the_report_says_so(tmp_path, capsys):
    from tula import config, model_inputs
    from tula.io import read_json
    from tula.model import memory as memory_mod
    from tula.model.perf import PerfModel
    from tula.stages import fit, predict, select
    from tula.stages.report.sections import model_section

    cfg_path = _config(tmp_path, no_sync_fallback=True)
    fit.run(
        cfg_path, _measurements(tmp_path, "error"), tmp_path / "memory.json", tmp_path / "perf.json"
    )
    assert "only N = 1 is predicted" in capsys.readouterr().out
    perf = read_json(tmp_path / "perf.json")
    assert perf["sync_measured"] is False and perf["step"] is None
    assert [
        (p["workers"], p["global_batch"], p["status"]) for p in perf["multi_worker_probes"]
    ] == [(2, 32, "error"), (2, 256, "error")]
    cfg = config.load(cfg_path)
    pred = predict.predict(
        model_inputs.planning(cfg),
        PerfModel.from_dict(perf),
        memory_mod.MemoryModel.from_dict(read_json(tmp_path / "memory.json")),
        train_samples=1024,
    )
    assert pred.loc[pred["workers"] == 2, "feasible"].eq(False).all()
    assert (
        pred.loc[pred["workers"] == 1, "sync_measured"].all()
        and not pred.loc[pred["workers"] == 2, "sync_measured"].any()
    )
    assert select.select(pred, model_inputs.planning(cfg)).selected.workers == 1
    assert "No multi-worker probe succeeded: communication was not measured" in model_section(perf)


def test_the_report_lists_where_sync_was_measured(tmp_path):
    from tula.io import read_json
    from tula.stages import fit
    from tula.stages.report.sections import model_section

    fit.run(
        _config(tmp_path),
        _measurements(tmp_path, "ok"),
        tmp_path / "memory.json",
        tmp_path / "perf.json",
    )
    perf = read_json(tmp_path / "perf.json")
    assert perf["sync_measured"] is True and perf["step"] is not None
    assert "Sync measured at N=2 B=32, N=2 B=256." in model_section(perf)
