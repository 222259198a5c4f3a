import pandas as pd
import pytest

from tula.model import measurements
from tula.stages import aggregate
from tula.io import write_json


def probe_record(n, b, status="ok", **kw):
    rec = dict(nodes=n, global_batch=b, local_batch=b // n, status=status)
    if status == "ok":
        rec.update(step_time_s=0.02, compute_time_s=0.015, sync_time_s=0.005, peak_mem_bytes=1000,
                   memory={"param_bytes": 10, "grad_bytes": 10, "opt_bytes": 10, "act_bytes": 900, "batch_bytes": 70},
                   env={"device": "cpu", "backend": "gloo"})  # fmt: skip
    rec.update(kw)
    return rec


def test_aggregate_keeps_failed_probes(tmp_path):
    files = []
    noisy = probe_record(2, 64, grad_noise_scale=150.0, grad_sq=0.3, grad_trace=45.0)
    for rec in (noisy, probe_record(1, 32), probe_record(2, 128, "oom", error="out of memory")):
        f = tmp_path / f"N{rec['nodes']}_B{rec['global_batch']}.json"
        write_json(f, rec)
        files.append(f)
    df = aggregate.aggregate(files, tmp_path / "m.csv")
    assert list(zip(df["nodes"], df["global_batch"])) == [(1, 32), (2, 64), (2, 128)]
    back = measurements.load(tmp_path / "m.csv")
    assert list(back["status"]) == ["ok", "ok", "oom"]
    assert back.loc[0, "act_bytes"] == 900 and back.loc[0, "backend"] == "gloo"
    # the gradient noise scale of a multi-worker probe; none for one worker or a failed probe
    assert (back.loc[1, "grad_noise_scale"], back.loc[1, "grad_sq"], back.loc[1, "grad_trace"]) == (150.0, 0.3, 45.0)
    assert back.loc[[0, 2], "grad_noise_scale"].isna().all()


def test_external_measurements_contract(tmp_path):
    p = tmp_path / "ext.csv"
    pd.DataFrame([dict(nodes=4, global_batch=256, local_batch=64, step_time_s=0.3, compute_time_s=0.2,
                       sync_time_s=0.1, peak_mem_bytes=5e9, status="ok")]).to_csv(p, index=False)  # fmt: skip
    assert len(measurements.load(p)) == 1


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.drop(columns=["sync_time_s"]), "missing column.*sync_time_s"),
        (lambda d: d.assign(step_time_s=["fast"]), "column step_time_s"),
        (lambda d: d.assign(local_batch=[32]), "local_batch x nodes"),
    ],
)
def test_bad_measurements_name_file_and_column(tmp_path, change, message):
    p = tmp_path / "bad.csv"
    base = pd.DataFrame([dict(nodes=4, global_batch=256, local_batch=64, step_time_s=0.3, compute_time_s=0.2,
                              sync_time_s=0.1, peak_mem_bytes=5e9, status="ok")])  # fmt: skip
    change(base).to_csv(p, index=False)
    with pytest.raises(ValueError, match=message):
        measurements.load(p)


def test_sweep_memory_and_fallback_rows_each_say_what_they_are(tmp_path):
    sweep = [{"local_batch": 16, "status": "ok", "compute_time_s": 0.01, "compute_time_cv": 0.05, "peak_mem_bytes": 600},
             {"local_batch": 128, "status": "oom", "error": "out of memory on rank(s) [0]"}]  # fmt: skip
    # the partial corner N2_B512 ran out of memory and fell back to B=256, which ran
    corner = probe_record(2, 512, "oom", error="out of memory", fallbacks=[probe_record(2, 256)])
    write_json(tmp_path / "N2_B64.json", probe_record(2, 64, sweep=sweep, train_samples=1437))
    write_json(tmp_path / "N2_B512.json", corner)
    write_json(tmp_path / "memory_probe.json", {"points": [
        {"local_batch": 8, "status": "ok", "peak_mem_bytes": 500, "memory": {"act_bytes": 300}},
        {"local_batch": 512, "status": "oom", "error": "out of memory at local batch 512"}],
        "env": {"device": "cpu", "backend": "gloo"}})  # fmt: skip
    aggregate.aggregate([tmp_path / "N2_B64.json", tmp_path / "N2_B512.json"], tmp_path / "m.csv",
                           memory_probe=tmp_path / "memory_probe.json")  # fmt: skip
    df = measurements.load(tmp_path / "m.csv")
    key = list(zip(df["source"], df["nodes"], df["global_batch"], df["local_batch"], df["status"]))
    assert key == [("probe", 2, 64, 32, "ok"), ("probe", 2, 256, 128, "ok"), ("probe", 2, 512, 256, "oom"),
                   ("sweep", 2, 64, 16, "ok"), ("sweep", 2, 64, 128, "oom"),
                   ("memory", 1, 8, 8, "ok"), ("memory", 1, 512, 512, "oom")]  # fmt: skip
    sw = df[df["source"] == "sweep"].iloc[0]
    assert sw["compute_time_s"] == 0.01 and pd.isna(sw["step_time_s"]) and pd.isna(sw["sync_time_s"])
    assert sw["probe_file"].endswith("N2_B64.json") and sw["train_samples"] == 1437
    fallback = df[(df["source"] == "probe") & (df["global_batch"] == 256)].iloc[0]
    assert fallback["probe_file"].endswith("N2_B512.json")  # the job that measured it
    assert len(measurements.probes(df)) == 3 and df[df["source"] == "memory"].iloc[0]["act_bytes"] == 300


def test_source_rows_are_checked_for_what_they_must_carry(tmp_path):
    row = dict(nodes=2, global_batch=64, local_batch=16, step_time_s=None, compute_time_s=None, sync_time_s=None,
               peak_mem_bytes=600, status="ok", source="sweep")  # fmt: skip
    p = tmp_path / "m.csv"
    pd.DataFrame([row]).to_csv(p, index=False)
    with pytest.raises(ValueError, match="row 2, column compute_time_s"):  # a sweep row is a compute time
        measurements.load(p)
    pd.DataFrame([row | {"source": "memory"}]).to_csv(p, index=False)
    assert measurements.load(p).loc[0, "peak_mem_bytes"] == 600  # a memory row needs no time
    pd.DataFrame([row | {"source": "guess"}]).to_csv(p, index=False)
    with pytest.raises(ValueError, match="column source: 'guess' is not one of probe, sweep, memory"):
        measurements.load(p)
