"""The whole DAG through Snakemake, on a tiny config in a temporary directory. The run itself
is conftest's session-wide ``finished_run``: every test here reads it, or a copy of it."""

import json
import math
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bounds import (
    FIT_BOUND,
    HELD_OUT_BOUND,
    PRODUCTION_BOUND,
    WALL_BOUND,
    check_accuracy,
    fit_error,
    held_out_prediction,
    log_error,
)
from conftest import OWN, ROOT, TINY, copy_workflow, snakemake, venv_env
from tula import config, model_inputs
from tula.faults import ENV as FAULT_ENV
from tula.model import measurements as measurements_mod
from tula.model import perf as perfmodel
from tula.model.grid import sweep_local_batches
from tula.progress import fmt_duration


def test_the_run_ends_with_the_answer_on_the_terminal(finished_run):
    """Snakemake's onsuccess prints the choice and why, what the production job paid against
    the prediction, the accuracy, what to trust and the report's path."""
    wd, _ = finished_run
    said = (wd / "snakemake.out").read_text()
    sel = json.loads((wd / "results" / "selection.json").read_text())["selected"]
    final = json.loads((wd / "results" / "train" / "final.json").read_text())
    assert f"tula: use N={sel['workers']} workers, global batch B={sel['global_batch']}" in said
    wall = final["wall_time_s"]
    wall = f"{wall:.1f} s" if wall < 60 else fmt_duration(wall)
    assert f"paid {wall} (x{final['wall_time_ratio']:.2f})" in said
    assert f"accuracy: {100 * final['final_test_acc']:.2f} % at the end" in said
    assert "  trust: " in said and f"report: {(wd / 'results' / 'report.html').resolve()}" in said
    # the memory budget the run planned on, and where it came from (no GPU named: the default)
    assert (
        "  memory budget: 14.4 GB per worker (the default 16 GB, no hardware.gpu named, less "
        "hardware.memory_margin 10 %)" in said
    )


def test_a_failing_rule_is_named_with_its_log_and_last_error(finished_run, tmp_path):
    """Both N = 2 probes failed (their records as a probe that failed writes them, in a copy of
    the shared run), so `tula fit` has no sync to fit and stops: Snakemake's onerror names the
    rule, its log and the error line in it. (The probes' own failures are recorded for real in
    tests/stages/test_probe.py; a campaign of its own bought nothing more here.)"""
    src, env = finished_run
    wd = tmp_path / "wd"
    shutil.copytree(src, wd, symlinks=True)
    for probe in (wd / OWN / "probes" / "N2").glob("B*.json"):
        rec = json.loads(probe.read_text())
        kept = ("schema", "workers", "nodes", "global_batch", "local_batch", "model", "dataset")
        failed = {k: rec[k] for k in kept} | {"status": "error", "error": "RuntimeError: boom"}
        probe.write_text(json.dumps(failed))
    # the job's list says how each point ended (Snakemake sees a file change by its content)
    job = wd / OWN / "probes" / "N2" / "job.json"
    job.write_text(
        json.dumps(json.loads(job.read_text()) | {"status": {"32": "error", "128": "error"}})
    )
    r = snakemake(
        wd, "--configfile", "tiny.yaml", env={k: v for k, v in env.items() if k != FAULT_ENV}
    )
    assert r.returncode != 0
    said = r.stdout + r.stderr
    ran = re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):", said, re.M)
    assert "probe" not in ran and "memprobe" not in ran, ran  # nothing measured again
    assert f"tula: rule fit failed; its log: {OWN}/logs/fit.log" in said, said[-3000:]
    last = [ln for ln in said.splitlines() if ln.startswith("  last error: ")]
    assert (
        last
        and last[0].removeprefix("  last error: ") in (wd / OWN / "logs" / "fit.log").read_text()
    )


def test_every_output_exists_and_parses(finished_run):
    wd, _ = finished_run
    res, own = wd / "results", wd / OWN
    probes = sorted(str(p.relative_to(own / "probes")) for p in (own / "probes").glob("*/*.json"))
    assert probes == [
        "N1/B128.json",
        "N1/B32.json",
        "N1/job.json",
        "N2/B128.json",
        "N2/B32.json",
        "N2/job.json",
    ]  # partial: 4 corners, one probe job per N (its list of them beside its records)
    assert json.loads((own / "probes" / "N2" / "job.json").read_text()) == {
        "schema": "tula.probe-job/1",
        "workers": 2,
        "batches": [32, 128],
        "records": ["B32.json", "B128.json"],
        "status": {"32": "ok", "128": "oom"},
        "probed": [32, 128],
        "kept": [],
    }
    # each job's first point ran in a fresh process (its first steps are a production job's), the
    # next in the same one; the job's points share its wall between them
    n1 = [json.loads((own / "probes" / "N1" / f"B{b}.json").read_text()) for b in (32, 128)]
    assert [r["fresh_process"] for r in n1] == [True, False]
    assert len({r["startup_time_s"] for r in n1}) == 1  # paid once, given to both
    assert sum(r["wall_s"] for r in n1) == pytest.approx(n1[0]["job_wall_s"])
    # at N = 2 the second point ran out of memory, which ended that launch: its fallback to the
    # next smaller batch ran in a launch of its own, first in its process
    n2 = [json.loads((own / "probes" / "N2" / f"B{b}.json").read_text()) for b in (32, 128)]
    assert [r["status"] for r in n2] == ["ok", "oom"] and n2[0]["fresh_process"]
    assert n2[1]["fallbacks"][0]["fresh_process"] and n2[1]["fallbacks"][0]["global_batch"] == 64
    assert n2[0]["wall_s"] + n2[1]["wall_s"] == pytest.approx(n2[0]["job_wall_s"])
    mp = json.loads((res / "memory_probe.json").read_text())  # the checkpoint every probe waited on
    assert mp["max_local_batch"] is not None and all(p["status"] == "ok" for p in mp["points"])
    # tula check's estimate from the model alone, checked by the memory probe, in the CSV and report
    assert json.loads((res / "workload.json").read_text())["estimate"]["per_sample_bytes"] > 0
    checked = mp["estimate"]["against_probe"]["points"]
    assert [r["local_batch"] for r in checked] == [p["local_batch"] for p in mp["points"]]
    m = pd.read_csv(res / "measurements.csv")
    assert list(m.loc[m["source"] == "memory", "estimate_mem_error"]) == pytest.approx(
        [r["error"] for r in checked]
    )
    assert "Memory from the model alone" in (res / "report.html").read_text()
    pr = m[m["source"] == "probe"]
    # N2_B128 ran out of memory (injected) and fell back to the next smaller batch, in the same job
    assert dict(
        zip(pr["workers"].astype(str) + "_" + pr["global_batch"].astype(str), pr["status"])
    ) == {"1_32": "ok", "1_128": "ok", "2_32": "ok", "2_64": "ok", "2_128": "oom"}
    assert pr.query("global_batch == 64")["probe_file"].item().endswith("N2/B128.json")
    sweep = m[m["source"] == "sweep"]
    # every launch of a probe job timed the grid's other local batches up to b_max once, at its
    # first point, less those the launch probes: N = 1 at B = 32 (B = 128 after it, in the same
    # process, names it), N = 2 at B = 32 (with B = 128), and the OOM corner's fallback
    # (B = 64), which ran in a launch of its own
    cfg = config.from_dict(TINY)
    launches = {
        (1, 32): [32, 128],
        (2, 32): [16, 64],
        (2, 64): [32],
    }  # -> the launch's local batches
    expected = {
        (n, lb)
        for (n, b), probed in launches.items()
        for lb in sweep_local_batches(
            model_inputs.grid_spec(cfg), n, b // n, mp["max_local_batch"], 1437 // 4, probed
        )
    }
    assert set(zip(sweep["workers"], sweep["global_batch"])) == set(launches)
    assert n1[1]["sweep"] == [] and n1[1]["sweep_in"] == n1[0]["sweep_in"] == "N1_B32"
    # the grid's local batches 16 ... 128: N = 1 sweeps 16 and 64 (it probes 32 and 128), the
    # N = 2 job 32 and 128 (it probes 16 and 64), its fallback launch 16, 64 and 128
    assert sorted(expected) == [(1, 16), (1, 64), (2, 16), (2, 32), (2, 64), (2, 128)]
    assert len(sweep) == 7 and (sweep["status"] == "ok").all()
    assert {(1, 32), (1, 128)}.isdisjoint(set(zip(sweep["workers"], sweep["local_batch"])))
    assert sweep["step_time_s"].isna().all() and (sweep["compute_time_s"] > 0).all()
    assert (m["source"] == "memory").sum() == len(mp["points"])
    memj, perf = (json.loads((res / "model" / f).read_text()) for f in ("memory.json", "perf.json"))
    assert (
        memj["search"] == "partial"
        and memj["fit"]["slope"] > 0
        and memj["fit"]["n_points"] >= len(mp["points"])
    )
    assert perf["rows_fitted"] == {"probe": 4, "sweep": len(sweep), "memory": len(mp["points"])}
    assert perf["compute"]["form"] in perfmodel.COMPUTE_FORMS and perf["probes_fitted"] == 4
    pred = pd.read_csv(res / "predictions.csv")
    assert len(pred) == 6  # N in {1,2} x B in {32,64,128}, probed or not
    # the OOM point
    assert not pred.query("workers == 2 and global_batch == 128")["feasible"].item()
    sel = json.loads((res / "selection.json").read_text())
    assert sel["objective"] == "knee" and (
        sel["selected"]["workers"],
        sel["selected"]["global_batch"],
    ) != (2, 128)
    final = json.loads((res / "train" / "final.json").read_text())
    assert (final["workers"], final["global_batch"]) == (
        sel["selected"]["workers"],
        sel["selected"]["global_batch"],
    )
    # the wall time predicted part by part from what the probes measured, beside what the job paid
    assert [p["part"] for p in final["wall_check"]] == [
        "steps",
        "start-up",
        "first steps",
        "evaluation",
        "checkpoints",
        "rest",
        "wall time",
    ]
    assert final["wall_time_ratio"] == pytest.approx(
        final["wall_time_s"] / final["predicted_wall_time_s"]
    )
    # the parts predicted add up to the wall predicted: the steps the job times apart (its first
    # at each shape) are out of the steps part and in the first steps', counted once
    parts = {p["part"]: p["predicted_s"] for p in final["wall_check"]}
    row = pd.read_csv(res / "predictions.csv").set_index(["workers", "global_batch"])
    row = row.loc[(final["workers"], final["global_batch"])]
    assert row["first_steps"] >= 1 and parts["steps"] == pytest.approx(
        row["train_time_s"] - row["first_steps"] * row["step_time_s"]
    )
    assert sum(v for k, v in parts.items() if k not in ("rest", "wall time")) == pytest.approx(
        final["predicted_wall_time_s"]
    )
    assert len(pd.read_csv(res / "train" / "metrics.csv")) == 2
    for png in (
        "time_vs_batch",
        "cost_vs_batch",
        "memory_vs_batch",
        "compute_vs_batch",
        "training",
        "steps",
    ):
        assert (res / "plots" / f"{png}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the job's own monitored steps (none at N = 1)
    steps = pd.read_csv(res / "train" / "steps.csv")
    assert {"step", "compute_time_s", "sync_time_s", "predicted_sync_s"} <= set(steps.columns)
    assert len(steps) == final["monitored_steps"] and (final["workers"] > 1 or len(steps) == 0)
    html = (res / "report.html").read_text()
    if final["monitored_steps"] == 0:  # the report says why, from what the job's monitor said
        why = (
            final["monitor_off"] or f"put the first pair at step {final['monitor_first_due_step']}"
        )
        assert why in html
    assert "Ran on <b>CPU</b> with gloo: hardware.device auto: this machine has no GPU" in html
    assert "Memory budget: 14.4 GB per worker (the default 16 GB, no hardware.gpu named" in html
    # what each probe job spent timing, and the campaign's share in the report
    meas = pd.read_csv(res / "measurements.csv")
    ok = meas[(meas["source"] == "probe") & (meas["status"] == "ok")]
    assert (ok["timed_s"] > 0).all() and (ok["probe_efficiency"] <= 1).all(), ok
    assert ((ok["timed_s"] / ok["wall_s"] - ok["probe_efficiency"]).abs() < 1e-9).all()
    assert "The probe campaign: " in html and "of what the probes cost bought a measurement" in html
    assert json.loads((res / "workload.json").read_text())["device"]["device"] == "cpu"
    assert (
        "Use N = " in html
        and html.count("data:image/png;base64,") == 5 + (len(steps) > 0)
        and "did not succeed" in html
    )
    # nothing monitored: one sentence, not an empty figure
    assert ('alt="steps"' in html) == (len(steps) > 0)
    assert ("Network drift" in html) == (len(steps) > 0) and ("No monitored steps" in html) == (
        len(steps) == 0
    )
    assert "OOM" in (wd / OWN / "logs" / "probe" / "N2.log").read_text()
    perf = json.loads((res / "model" / "perf.json").read_text())
    # the ok probes
    assert perf["compute"]["form"] and perf["compute"]["why"] and len(perf["residuals"]) == 4
    assert sel["knee"]["rule"] == "marginal" and {"marginal", "kneedle"} <= set(sel["knee"])
    # Snakemake's benchmark of the train rule
    bench = pd.read_csv(res / "benchmarks" / "launch.tsv", sep="\t")
    assert len(bench) == 1 and bench["s"].item() >= final["train_time_s"] > 0


def test_the_production_job_confirms_its_prediction_within_the_machines_noise(finished_run):
    """The production job's mean step and its wall time against the prediction's point
    estimate at the trained point, within fixed bounds made of this machine's measured noise
    (tests/bounds.py: PRODUCTION_BOUND x1.68, WALL_BOUND x1.93, from the hour's drift between
    processes and the widest probe's half-width; never from this run's own interval). A
    prediction x2 is past them; x1.3 is inside the drift here, and the next test catches it."""
    wd, _ = finished_run
    final = json.loads((wd / "results" / "train" / "final.json").read_text())
    for what, measured, predicted, bound in (
        ("step", final["mean_step_time_s"], final["predicted_step_time_s"], PRODUCTION_BOUND),
        ("wall time", final["wall_time_s"], final["predicted_wall_time_s"], WALL_BOUND),
    ):
        e = log_error(measured, predicted)
        assert e <= bound, (
            f"the production {what} {measured:.4f} s lies x{math.exp(e):.2f} from its "
            f"prediction {predicted:.4f} s (allowed x{math.exp(bound):.2f})"
        )


def test_the_prediction_reproduces_the_probes_it_was_fitted_on(finished_run):
    """predictions.csv at each probed point against that probe's measured step: the median of
    |log(predicted / measured)| within FIT_BOUND (tests/bounds.py). The same measurements on
    both sides, so no drift between processes: a prediction scaled x1.3 or x0.77 moves every
    point by 0.26 and fails here, where the production job's drift would hide it."""
    wd, _ = finished_run
    p = pd.read_csv(wd / "results" / "predictions.csv")
    assert (p["probe_status"] == "ok").sum() >= 3, p[["workers", "global_batch", "probe_status"]]
    error = fit_error(p)
    assert error <= FIT_BOUND, (error, FIT_BOUND)


def test_the_default_run_trains_to_its_points_accuracy(finished_run):
    """digits, 10 classes (chance 0.10): the tiny config's 2 epochs at the point the choice
    landed on, against that point's recorded accuracy (training at a point is deterministic:
    the same seed, order and gloo sums; tests/accuracy.json, made by bench/suite_bounds.py
    --accuracy). A run at 90 % of it fails; labels shuffled, it ends near 0.10."""
    wd, _ = finished_run
    final = json.loads((wd / "results" / "train" / "final.json").read_text())
    n, b = final["workers"], final["global_batch"]
    check_accuracy(f"tiny digits N{n} B{b}", final["final_test_acc"])


def test_a_point_left_out_of_the_fit_is_predicted_within_its_noise(finished_run):
    """The N = 2, B = 64 probe (the OOM corner's fallback, between the corners a partial
    search probes) left out, with the compute-only sweep its launch timed and the kept N = 2
    launch's sweep at its local batch (32): the rest's fit predicts its step within
    HELD_OUT_BOUND (tests/bounds.py: the left-out probe's and the fit's half-widths and the
    drift between probe jobs, fixed). A prediction x2 adds log 2 = 0.69: past it."""
    wd, _ = finished_run
    m = measurements_mod.load(wd / "results" / "measurements.csv")
    predicted, measured = held_out_prediction(m, 2, 64, "ring")
    error = log_error(measured, predicted)
    assert error <= HELD_OUT_BOUND, (predicted, measured, HELD_OUT_BOUND)


def test_nothing_to_do_after_a_finished_run(finished_run):
    wd, env = finished_run
    r = snakemake(wd, "--configfile", "tiny.yaml", "-n", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Nothing to be done" in r.stdout + r.stderr


def test_a_pricing_change_reruns_selection_not_probes(finished_run):
    """Really run up to the choice with another objective (time to accuracy, from the probes'
    gradient noise scale): selection.json changes, and no probe, the memory probe or the
    measurements are touched."""
    wd, env = finished_run
    res, own = wd / "results", wd / OWN
    kept = [  # the partition's own files (results/ holds copies that the choice puts there)
        *(own / "probes").glob("*/*.json"),
        own / "memory_probe.json",
        own / "measurements.csv",
        own / "model" / "perf.json",
    ]
    before = {f: f.stat().st_mtime_ns for f in kept}
    sel_before = (res / "selection.json").stat().st_mtime_ns
    r = snakemake(
        wd,
        "--configfile",
        "tiny.yaml",
        "--config",
        "objective=time_to_accuracy",
        "--until",
        "combine",
        env=env,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert {f: f.stat().st_mtime_ns for f in kept} == before
    assert (res / "selection.json").stat().st_mtime_ns > sel_before
    sel = json.loads((res / "selection.json").read_text())
    # the N=2 probes measured the gradient noise scale; the objective chose by it
    assert sel["objective"] == "time_to_accuracy" and sel["noise"]["b_noise"] > 0
    assert set(sel["noise"]["versus"]) == {"time", "knee"} and "B_noise = " in sel["reason"]


def planned_jobs(out: str) -> dict[str, int]:
    """The "Job stats" table of a Snakemake dry run: rule -> jobs planned."""
    table = out.split("Job stats:", 1)[1] if "Job stats:" in out else ""
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)
        if m.group(1) != "total"
    }


@pytest.mark.parametrize(
    "change, probes, reruns",
    [
        ({"train": {"lr": 0.01}}, 0, {"launch"}),
        ({"train": {"lr_decay_epochs": [1], "warmup_epochs": 1}}, 0, {"launch"}),
        ({"workload": {"epochs": 3}}, 0, {"predict", "launch"}),
        ({"objective": "time"}, 0, {"select", "launch"}),
        ({"pricing": {"per_worker_hour": 9.0}}, 0, {"predict", "select"}),
        ({"probe": {"timed_steps": 4}}, 2, {"aggregate", "fit", "predict"}),
    ],
)
def test_probes_are_bought_once(finished_run, change, probes, reruns, tmp_path):
    """What Snakemake plans after each kind of change: the learning rate, its schedule, the
    epochs, the objective and the pricing re-run their own stages and reuse every probe job
    and the memory probe; what changes the timed step re-runs every probe job (one per N).
    (Other tests of
    this module leave the light stages in other states; the probes are what is counted.)"""
    wd, env = finished_run
    (wd / "change.yaml").write_text(yaml.safe_dump(change))
    r = snakemake(wd, "--configfile", "tiny.yaml", "change.yaml", "-n", env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    jobs = planned_jobs(r.stdout + r.stderr)
    assert jobs.get("probe", 0) == probes and "memprobe" not in jobs and reruns <= set(jobs), (
        change,
        jobs,
    )
    assert (
        "tula: probe campaign: the memory probe (1 node) and 2 probe job(s), one per N, 4 point(s)"
        in r.stdout + r.stderr
    )


def test_a_wider_grid_runs_only_the_new_probes(finished_run, tmp_path):
    """Adding a batch to the grid (batch_max 128 -> 256) in a copy of a finished run: the
    memory probe measures again (one worker), the two new corners are probed by their N's
    jobs, and the four probes already bought are neither run again nor touched: each job keeps
    its records measured with the same settings."""
    src, env = finished_run
    wd = tmp_path / "wd"
    shutil.copytree(src, wd, symlinks=True)
    probes_dir = wd / OWN / "probes"
    old = {
        str(f.relative_to(probes_dir)): f.stat().st_mtime_ns for f in probes_dir.glob("N*/B*.json")
    }
    (wd / "wider.yaml").write_text(yaml.safe_dump({"grid": {"batch_max": 256}}))
    r = snakemake(
        wd,
        "--configfile",
        "tiny.yaml",
        "wider.yaml",
        "--until",
        "aggregate",
        env={k: v for k, v in env.items() if k != FAULT_ENV},
    )
    assert r.returncode == 0, r.stderr[-4000:]
    ran = re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):", r.stdout + r.stderr, re.M)
    probes = {
        str(f.relative_to(probes_dir)): f.stat().st_mtime_ns for f in probes_dir.glob("N*/B*.json")
    }
    assert {k: probes[k] for k in old} == old  # the probes bought before: not run again
    mp_bmax = json.loads((wd / OWN / "memory_probe.json").read_text())["max_local_batch"]
    new = sorted(set(probes) - set(old))
    assert new == sorted(f"N{n}/B256.json" for n in (1, 2) if 256 // n <= mp_bmax)
    # one job for each N with a new batch, which kept its old records
    assert ran.count("probe") == len(new) >= 1 and ran.count("memprobe") == 1, ran
    for f in new:
        job = json.loads((probes_dir / f).parent.joinpath("job.json").read_text())
        assert job["probed"] == [256] and job["kept"] == [32], job
        log = (wd / OWN / "logs" / "probe" / f"{Path(f).parent}.log").read_text()
        assert "kept: " in log and "was measured with the same settings" in log, log[-2000:]


def test_dry_run_shows_the_memory_checkpoint_and_what_waits_on_it(tmp_path, venv_path):

    copy_workflow(tmp_path)
    (tmp_path / "workflow" / "config.yaml").write_text(
        (ROOT / "workflow" / "config.yaml").read_text()
    )
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    r = snakemake(tmp_path, "--configfile", "tiny.yaml", "-n")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    # the probes are not known before the memory probe has run: the dry run lists the checkpoint
    # and the jobs after it, and no probe yet
    assert (
        "checkpoint memprobe" in out and "rule probe:" not in out and "alteration of the DAG" in out
    )
    stats = out[out.index("Job stats:") :]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", stats.split("\n\n")[0], flags=re.M))
    assert counts == {
        rule: "1"
        for rule in (
            "aggregate",
            "all",
            "check",
            "fit",
            "launch",
            "memprobe",
            "plot_selection",
            "plot_training",
            "predict",
            "report",
            "select",
            "queue",  # the partition's queue: none locally, and its file says so
            "combine",  # the choice across one partition: its own, put in results/
        )
    } | {"total": "13"}
    # hardware.device auto, decided once (no GPU in CI) and said; a dry run writes nothing of
    # Tula's: no results, no config snapshot (onstart writes it before a real run's first job)
    assert (
        out.count("tula: hardware.device auto: this machine has no GPU: CPU and gloo; backend gloo")
        == 1
    )
    assert not (tmp_path / "results").exists() and not (tmp_path / ".snakemake" / "tula").exists()
    # what results/ holds that this run will not read is named before anything runs
    for old in ("probes/N2", "partitions/gone"):
        (tmp_path / "results" / old).mkdir(parents=True)
    out = snakemake(tmp_path, "--configfile", "tiny.yaml", "-n").stdout
    assert (
        "tula: results/partitions/gone is another partition's (not in this config's table: " in out
    )
    assert "tula: results/probes: from Tula's layout before results/partitions/<name>/" in out


def test_the_jobs_read_the_decided_device_from_the_snapshot(finished_run):
    wd, _ = finished_run
    snap = config.load(wd / ".snakemake" / "tula" / "config.json").hardware
    assert (snap.device, snap.backend) == ("cpu", "gloo") and "no GPU" in snap.device_why
    probe = json.loads(next((wd / OWN / "probes" / "N1").glob("B*.json")).read_text())
    assert (probe["env"]["device"], probe["env"]["backend"]) == ("cpu", "gloo")


@pytest.mark.dag
def test_the_gpu_the_config_names_reaches_the_snapshot_the_memory_probe_and_the_resident_rule(
    tmp_path,
):
    """`hardware.gpu: h100` and no device_memory_gb: Snakemake's own validate (which fills the
    schema's defaults) no longer puts 16 GB in front of the H100's 80, so the snapshot the jobs
    read, the memory probe's budget and the resident rule all plan on 72 GB per worker, and
    `tula check --resolved` writes the same snapshot, key for key."""
    import torch

    from tula.runtime.input.loader import RESIDENT_SHARE, keep_on_device

    copy_workflow(tmp_path)
    full = yaml.safe_load((ROOT / "workflow" / "config.yaml").read_text())
    for section, values in {**TINY, "hardware": {"gpu": "h100"}}.items():
        full[section] = {**full[section], **values} if isinstance(values, dict) else values
    (tmp_path / "workflow" / "config.yaml").write_text(yaml.safe_dump(full))
    r = snakemake(tmp_path, "--until", "memprobe", env=venv_env())
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    snap_path = tmp_path / ".snakemake" / "tula" / "config.json"
    snap = config.load(snap_path)
    assert snap.hardware.device_memory_gb == 80 and snap.hardware.memory_budget_bytes == 72e9
    assert snap.hardware.device_memory_why == "hardware.gpu: h100, 80 GB"
    mp = json.loads((tmp_path / OWN / "memory_probe.json").read_text())
    assert mp["budget_bytes"] == 72e9
    said = (tmp_path / OWN / "logs" / "check.log").read_text()
    assert (
        "memory budget: 72.0 GB per worker (hardware.gpu: h100, 80 GB, less "
        "hardware.memory_margin 10 %)" in said
    )
    # the resident rule on a 5 GB in-memory set: within 25 % of 72 GB, not of the old 14.4
    data = type("Data", (), {})()
    data.train = type("Set", (), {"__getitems__": None})()
    data.train.x = torch.empty(5 * 10**9, dtype=torch.uint8, device="meta")
    data.train.y = torch.empty(0, dtype=torch.int64, device="meta")
    size, budget, old = 5e9, 72e9, 14.4e9
    assert size <= RESIDENT_SHARE * budget and size > RESIDENT_SHARE * old
    assert keep_on_device(snap, data, torch.device("cuda"))
    default = config.from_dict({**TINY, "data": {"on_device": "auto"}})
    assert not keep_on_device(default, data, torch.device("cuda"))
    # the contract: what `tula check` resolves is what the jobs read, every key
    r = subprocess.run(
        ["tula", "check", "--config-only", "--config", "workflow/config.yaml"]
        + ["--resolved", "check.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=venv_env(),
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "check.json").read_text() == snap_path.read_text()


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "grid:\n  workers: [1, 3]\n  batch_min: 32\n",
            "config key 'grid.workers': N=3 does not divide",
        ),
        (
            "workload:\n  dataset: npz:/no/such/file.npz\n",
            "config key 'workload.dataset': npz file /no/such/file.npz not found",
        ),
        (
            "workload:\n  dataset: imagefolder:/no/such/root\n",
            "config key 'workload.dataset': image folder /no/such/root/train not found",
        ),
        (
            "hardware:\n  device: cuda\n",  # CI has no GPU: cuda is refused before anything runs
            "config key 'hardware.device' is cuda, but this machine has no GPU: set "
            "hardware.device: auto",
        ),
        (  # a value the schema's pattern refuses is said in words, every such key at once
            "workload:\n  model: resnet51\n  dataset: cifar10\n",
            "config key 'workload.dataset': 'cifar10' is not digits, mnist1d, npz:<path>, "
            "imagefolder:<root>, or your own as package.module:callable\n"
            "  - config key 'workload.model': 'resnet51' is not a shipped model",
        ),
    ],
)
def test_bad_config_stops_before_any_job(tmp_path, venv_path, text, message):
    copy_workflow(tmp_path)
    (tmp_path / "workflow" / "config.yaml").write_text(text)
    r = snakemake(tmp_path, "-n")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert message in out
    # Tula's loader speaks first: not Snakemake's dump of the schema and its regular expressions
    assert "Failed validating" not in out and "does not match" not in out, out
    assert not (tmp_path / "results").exists()


def test_a_config_tulas_loader_takes_the_workflow_takes(tmp_path, venv_path):
    """YAML reads an unquoted `replan: off` (a value config.yaml lists) as false. Tula's loader
    takes it as "off"; the workflow validated the raw config first and refused it."""
    copy_workflow(tmp_path)
    (tmp_path / "workflow" / "config.yaml").write_text("launch:\n  replan: off\n")
    r = snakemake(tmp_path, "-n")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert not (tmp_path / "results").exists()


def test_lint_is_clean_and_writes_nothing(tmp_path, venv_path):
    copy_workflow(tmp_path)
    (tmp_path / "workflow" / "config.yaml").write_text(
        (ROOT / "workflow" / "config.yaml").read_text()
    )
    r = subprocess.run(["snakemake", "--lint"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0 and "good condition" in r.stdout + r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / ".snakemake" / "tula").exists()


def test_snakemake_report_needs_no_cores_flag(finished_run, tmp_path):
    wd, env = finished_run
    r = subprocess.run(
        ["snakemake", "--report", str(tmp_path / "report.zip")],
        cwd=wd,
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    with zipfile.ZipFile(tmp_path / "report.zip") as z:
        assert z.testzip() is None  # every member's CRC checks
        names = z.namelist()
    assert sum(n.endswith("/report.html") for n in names) == 1, names
    pngs = sorted(n.rsplit("/", 1)[1] for n in names if n.endswith(".png"))
    assert pngs == [
        "compute_vs_batch.png",
        "cost_vs_batch.png",
        "memory_vs_batch.png",
        "steps.png",
        "time_vs_batch.png",
        "training.png",
    ], names  # the rules' report() outputs, each once


@pytest.mark.training
def test_oom_in_training_relaunches_smaller_and_the_report_shows_the_attempts(finished_run):
    """The train rule, re-run with an injected OOM at the selected batch: `tula launch` relaunches
    at the next smaller batch from the last checkpoint, and report.html shows both attempts."""
    from tula.faults import ENV

    wd, env = finished_run
    # objective time: a larger batch than the knee's (which may be grid.batch_min on this CPU), so
    # that a smaller one is left to fall back to
    r = snakemake(
        wd, "--configfile", "tiny.yaml", "--config", "objective=time", "--until", "combine", env=env
    )
    assert r.returncode == 0, r.stderr[-4000:]
    sel = json.loads((wd / "results" / "selection.json").read_text())["selected"]
    b = sel["global_batch"]
    assert b > 32, f"objective time chose B={b}: no smaller batch >= grid.batch_min to fall back to"
    r = snakemake(
        wd,
        "--configfile",
        "tiny.yaml",
        "--config",
        "objective=time",
        "--forcerun",
        "launch",
        env={**env, ENV: f"oom:step={-(-1437 // b) + 2},rank=0,batch={b}"},
    )  # in epoch 2, after a checkpoint
    assert r.returncode == 0, r.stderr[-4000:]
    att = json.loads((wd / "results" / "train" / "attempts.json").read_text())["attempts"]
    assert [a["outcome"] for a in att] == ["oom", "completed"] and att[0]["global_batch"] == b
    assert att[1]["global_batch"] < b and att[1]["start_step"] == att[0]["checkpoint_step"]
    html = (wd / "results" / "report.html").read_text()
    assert f"relaunched from its last checkpoint at B={att[1]['global_batch']}" in html
    assert (
        "<td class=bad>oom</td>" in html
        and (wd / "results" / "train" / "model.pt").stat().st_size > 0
    )
