import pandas as pd

from tula.io import write_json
from tula.model import measurements
from tula.stages import aggregate


def probe_record(n, b, status="ok", **kw):
    rec = dict(workers=n, global_batch=b, local_batch=b // n, status=status)
    if status == "ok":
        rec.update(
            step_time_s=0.02,
            compute_time_s=0.015,
            sync_time_s=0.005,
            peak_mem_bytes=1000,
            memory={
                "param_bytes": 10,
                "grad_bytes": 10,
                "opt_bytes": 10,
                "act_bytes": 900,
                "batch_bytes": 70,
            },
            env={"device": "cpu", "backend": "gloo"},
        )
    rec.update(kw)
    return rec


def test_aggregate_keeps_failed_probes(tmp_path):
    files = []
    noisy = probe_record(2, 64, grad_noise_scale=150.0, grad_sq=0.3, grad_trace=45.0)
    noisy["timed_steps"] = 20  # probe.timed_steps, as the probe ran: the precision's least steps
    for rec in (noisy, probe_record(1, 32), probe_record(2, 128, "oom", error="out of memory")):
        f = tmp_path / f"N{rec['workers']}_B{rec['global_batch']}.json"
        write_json(f, rec)
        files.append(f)
    df = aggregate.run(files, tmp_path / "m.csv")
    assert list(zip(df["workers"], df["global_batch"])) == [(1, 32), (2, 64), (2, 128)]
    back = measurements.load(tmp_path / "m.csv")
    assert list(back["status"]) == ["ok", "ok", "oom"]
    assert back.loc[0, "act_bytes"] == 900 and back.loc[0, "backend"] == "gloo"
    # the gradient noise scale of a multi-worker probe; none for one worker or a failed probe
    assert (back.loc[1, "grad_noise_scale"], back.loc[1, "grad_sq"], back.loc[1, "grad_trace"]) == (
        150.0,
        0.3,
        45.0,
    )
    assert back.loc[[0, 2], "grad_noise_scale"].isna().all()
    assert back.loc[1, "precision_min_steps"] == 20 and pd.isna(back.loc[0, "precision_min_steps"])


def test_sweep_memory_and_fallback_rows_each_say_what_they_are(tmp_path):
    sweep = [
        {
            "local_batch": 16,
            "status": "ok",
            "compute_time_s": 0.01,
            "compute_time_cv": 0.05,
            "peak_mem_bytes": 600,
        },
        {"local_batch": 128, "status": "oom", "error": "out of memory on rank(s) [0]"},
    ]
    # the partial corner N2_B512 ran out of memory and fell back to B=256, which ran
    corner = probe_record(2, 512, "oom", error="out of memory", fallbacks=[probe_record(2, 256)])
    write_json(tmp_path / "N2_B64.json", probe_record(2, 64, sweep=sweep, train_samples=1437))
    write_json(tmp_path / "N2_B512.json", corner)
    write_json(
        tmp_path / "memory_probe.json",
        {
            "points": [
                {
                    "local_batch": 8,
                    "status": "ok",
                    "peak_mem_bytes": 500,
                    "memory": {"act_bytes": 300},
                },
                {"local_batch": 512, "status": "oom", "error": "out of memory at local batch 512"},
            ],
            "env": {"device": "cpu", "backend": "gloo"},
        },
    )
    aggregate.run(
        [tmp_path / "N2_B64.json", tmp_path / "N2_B512.json"],
        tmp_path / "m.csv",
        memory_probe=tmp_path / "memory_probe.json",
    )
    df = measurements.load(tmp_path / "m.csv")
    key = list(
        zip(df["source"], df["workers"], df["global_batch"], df["local_batch"], df["status"])
    )
    assert key == [
        ("probe", 2, 64, 32, "ok"),
        ("probe", 2, 256, 128, "ok"),
        ("probe", 2, 512, 256, "oom"),
        ("sweep", 2, 64, 16, "ok"),
        ("sweep", 2, 64, 128, "oom"),
        ("memory", 1, 8, 8, "ok"),
        ("memory", 1, 512, 512, "oom"),
    ]
    sw = df[df["source"] == "sweep"].iloc[0]
    assert (
        sw["compute_time_s"] == 0.01 and pd.isna(sw["step_time_s"]) and pd.isna(sw["sync_time_s"])
    )
    assert sw["probe_file"].endswith("N2_B64.json") and sw["train_samples"] == 1437
    fallback = df[(df["source"] == "probe") & (df["global_batch"] == 256)].iloc[0]
    assert fallback["probe_file"].endswith("N2_B512.json")  # the job that measured it
    assert (
        len(measurements.probes(df)) == 3
        and df[df["source"] == "memory"].iloc[0]["act_bytes"] == 300
    )


def test_each_probe_row_says_what_its_job_spent_timing_and_the_report_sums_it(tmp_path):
    """timed_s = the timed steps' seconds (synced, compute-only with the other kinds each arm
    timed, the sweep's ok batches: a mean x its steps); probe_efficiency = timed_s / wall_s; a
    failed probe bought none; the report's precision section sums the campaign. The probe
    job's job.json names its records."""
    from tula.stages.report.trust import precision_section

    sweep = [
        {"local_batch": 16, "status": "ok", "compute_time_s": 0.01, "compute_timed_steps": 6},
        {"local_batch": 128, "status": "oom", "error": "out of memory"},
    ]
    timing = dict(step_timed_steps=40, compute_timed_steps=30, wall_s=10.0, sweep=sweep)
    # the kinds each arm's mean weighed in count; steps set aside (compute's plain) do not
    timing.update(step_other_steps={"start": 3, "partial": 2}, compute_other_steps={"plain": 9})
    timing.update(step_halfwidth_mix={"start": 0.1, "partial": 0.1}, compute_halfwidth_mix=None)
    job = tmp_path / "N2"
    write_json(job / "B64.json", probe_record(2, 64, **timing))
    write_json(job / "B32.json", probe_record(2, 32, "error", error="boom", wall_s=6.0))
    write_json(job / "B16.json", probe_record(2, 16))  # an earlier grid's: not this job's
    listed = {"schema": "tula.probe-job/1", "workers": 2, "records": ["B32.json", "B64.json"]}
    write_json(job / "job.json", listed)
    out = tmp_path / "m.csv"
    aggregate.run([job / "job.json"], out)
    df = pd.read_csv(out)
    ok = df[(df["source"] == "probe") & (df["status"] == "ok")].iloc[0]
    timed = 0.02 * (40 + 5) + 0.015 * 30 + 0.01 * 6  # each arm's steps at its mean, the sweep's
    assert abs(ok["timed_s"] - timed) < 1e-12
    assert abs(ok["probe_efficiency"] - ok["timed_s"] / timing["wall_s"]) < 1e-12
    failed = df[df["status"] == "error"].iloc[0]
    assert pd.isna(failed["timed_s"]) and pd.isna(failed["probe_efficiency"])
    assert df[df["source"] == "sweep"]["timed_s"].isna().all()
    df["precision_reached"], df["precision_target"] = True, 0.02
    df["compute_time_halfwidth_rel"] = 0.01
    html = precision_section(df)
    assert (
        "The probe campaign: 2 probe(s) in 1 job(s), one per N, ran 16.0 s (their workers' wall, "
        "summed; 8.0 s a probe) for 1.4 s of timed steps: <b>9 %</b> of what the probes cost "
        "bought a measurement" in html
    )
    assert sorted(df.loc[df["source"] == "probe", "global_batch"]) == [32, 64] and (
        df["probe_file"].str.endswith(("N2/B32.json", "N2/B64.json")).all()
    )
