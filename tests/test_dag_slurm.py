"""Against a real SLURM cluster: scripts/slurm-cluster.sh up starts a one-node one (root).

`make test` does that under CI=true and then these tests must pass; elsewhere they skip,
saying why, when no controller answers.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bounds import check_accuracy
from conftest import (
    OWN,
    ROOT,
    SLURM_SNAKEMAKE,
    TINY,
    copy_workflow,
    digits_uint8,
    slurm_test_profile,
    train_from_files,
    venv_env,
)
from selections import selection_json
from tula import config
from tula.checkpoint import load_latest
from tula.faults import ENV as FAULT_ENV

pytestmark = pytest.mark.slurm
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED")


def sacct(*args: str) -> str:
    return subprocess.run(
        ["sacct", "-n", "-P", *args], capture_output=True, text=True, check=True
    ).stdout


def wait_for_job(job_id: str, timeout_s: float = 180) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        state = sacct("-X", "-j", job_id, "-o", "State").strip()
        if state and state.split()[0] in FINAL:
            return state.split()[0]
        time.sleep(1)
    raise TimeoutError(f"SLURM job {job_id} did not finish in {timeout_s}s")


def test_two_task_probe_under_srun(slurm_cluster, tiny_config_file, tmp_path):
    out = tmp_path / "N2_B64.json"
    tula = Path(sys.executable).parent / "tula"
    job = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-n",
            "2",
            "-o",
            str(tmp_path / "job-%j.out"),
            "--wrap",
            f"{tula} probe --config {tiny_config_file} --workers 2 --global-batch 64 --out {out}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert wait_for_job(job) == "COMPLETED"
    # one 2-task srun step
    assert f"{job}.0|2|COMPLETED" in sacct("-j", job, "-o", "JobID,NTasks,State")
    rec = json.loads(out.read_text())
    assert rec["status"] == "ok", rec.get("error")
    assert (
        rec["env"]["launcher"] == "slurm"
        and rec["env"]["world_size"] == 2
        and rec["env"]["backend"] == "gloo"
    )


def test_profile_dry_run_on_a_fresh_checkout(tmp_path):
    """`snakemake -n --profile slurm`, the users' command, from the repository root: the short
    name finds the root's `slurm` link to profiles/slurm (the one profile), and the dry run
    builds the DAG up to the memory-probe checkpoint with the profile's resources (needs no
    cluster: a dry run submits nothing)."""
    assert os.readlink(ROOT / "slurm") == "profiles/slurm"
    copy_workflow(tmp_path)
    (tmp_path / "workflow" / "config.yaml").write_text(
        (ROOT / "workflow" / "config.yaml").read_text()
    )
    shutil.copytree(ROOT / "profiles", tmp_path / "profiles")
    os.symlink("profiles/slurm", tmp_path / "slurm")
    env = venv_env()
    r = subprocess.run(
        ["snakemake", "-n", "--profile", "slurm"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "Using profile slurm" in out
    job = out[out.index("checkpoint memprobe:") : out.index("DAG of jobs will be updated")]
    line = next(ln for ln in job.splitlines() if ln.strip().startswith("resources:"))
    res = dict(kv.strip().split("=", 1) for kv in line.split(":", 1)[1].split(","))
    # the profile's default-resources, and the rule's own (one worker, probe.timeout_s + 5 min)
    assert {k: res.get(k) for k in ("mem_mb", "tasks", "nodes", "cpus_per_task", "runtime")} == {
        "mem_mb": "16000",
        "tasks": "1",
        "nodes": "1",
        "cpus_per_task": "1",
        "runtime": "15",
    }, line
    assert "Shell command: tula memprobe" in job  # the profile's printshellcmds
    # the dry run cannot see the SLURM executor (Snakemake swaps in its own): it says whose
    # device decision it shows rather than pass this machine's off as the partition's
    assert "(a dry run: Snakemake runs no executor, so this is this machine's answer;" in out
    assert not (tmp_path / "results").exists()


def test_the_profiles_partition_and_account_reach_the_training_job(tmp_path):
    """default-resources' slurm_partition/slurm_account become `tula launch` options in the train
    rule (the config's launch.slurm_* win over them inside tula launch: test_launch.py)."""
    copy_workflow(tmp_path)
    (tmp_path / "workflow" / "config.yaml").write_text(
        (ROOT / "workflow" / "config.yaml").read_text()
    )
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    profile["default-resources"].update(slurm_partition="gpu_part", slurm_account="proj_acct")
    (tmp_path / "prof").mkdir()
    (tmp_path / "prof" / "config.yaml").write_text(yaml.safe_dump(profile))
    env = venv_env()
    r = subprocess.run(
        ["snakemake", "-n", "--profile", "prof"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    train = out[out.index("rule launch:") :]
    train = train[: train.index("\n\n")]
    assert "--slurm-partition gpu_part --slurm-account proj_acct" in train, train
    assert "--timeout-min 1440" in train  # set-resources: launch: runtime


# what the lab profile changes of profiles/slurm: (section or None, key)
LAB_KEYS = {
    (None, "jobs"),
    (None, "latency-wait"),
    (None, "slurm-init-seconds-before-status-checks"),
    ("default-resources", "slurm_account"),
    ("default-resources", "slurm_partition"),
    ("default-resources", "mem_mb"),
    ("set-resources", "launch"),
}


def _flat(profile: dict) -> dict:
    out = {}
    for key, value in profile.items():
        if key in ("default-resources", "set-resources"):
            out.update({(key, k): v for k, v in (value or {}).items()})
        else:
            out[(None, key)] = value
    return out


def test_the_shipped_lab_profile_is_the_slurm_profile_with_the_labs_keys():
    """profiles/lab (docs/slurm.md's two-node command, run by tests/test_slurm_lab.py) cannot
    drift from the profile users copy: every key not the lab's own is profiles/slurm's."""
    slurm, lab = (
        _flat(yaml.safe_load((ROOT / "profiles" / name / "config.yaml").read_text()))
        for name in ("slurm", "lab")
    )
    changed = {k for k in slurm.keys() | lab.keys() if slurm.get(k) != lab.get(k)}
    assert changed == LAB_KEYS, changed ^ LAB_KEYS
    assert lab[("default-resources", "slurm_partition")] == "lab"
    assert (
        "snakemake --profile profiles/lab --configfile profiles/lab/tula.yaml"
        in (ROOT / "docs" / "slurm.md").read_text()
    )
    cfg = config.load(ROOT / "profiles" / "lab" / "tula.yaml")
    assert (tuple(cfg.grid.workers), cfg.cluster.workers_per_node) == ((1, 2, 4), 2)
    assert cfg.hardware.device == "cpu"


@pytest.fixture(scope="module")
def dag_on_slurm(tmp_path_factory, slurm_cluster):
    """The whole DAG via `snakemake --profile <test profile derived from profiles/slurm>`."""
    wd = tmp_path_factory.mktemp("slurm-dag")
    copy_workflow(wd)
    (wd / "workflow" / "config.yaml").write_text((ROOT / "workflow" / "config.yaml").read_text())
    # the test cluster has one node; digits stored as uint8 images, standardised per batch
    u8 = digits_uint8(wd / "digits_u8.npz")
    tiny = {
        **TINY,
        "workload": {**TINY["workload"], "dataset": f"npz:{u8}"},
        "cluster": {"workers_per_node": 2},
    }
    (wd / "tiny.yaml").write_text(yaml.safe_dump(tiny))
    slurm_test_profile(wd)
    env = venv_env()
    env[FAULT_ENV] = "oom:point=N2_B128,rank=1"  # sbatch --export=ALL carries it into the job
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 2))
    r = subprocess.run(
        [
            "timeout",
            "-s",
            "INT",
            "900",
            *SLURM_SNAKEMAKE,
            "--profile",
            "profiles/test",
            "--configfile",
            "tiny.yaml",
        ],
        cwd=wd,
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    rows = [
        line.split("|")
        for line in sacct("-X", "-S", started, "-o", "JobID,JobName,Comment,State").splitlines()
        if line
    ]
    jobs = {
        comment: (job_id, state)
        for job_id, _, comment, state in rows
        if comment.startswith("rule_")
    }
    jobs.update({name: (job_id, state) for job_id, name, _, state in rows if name == "tula-train"})
    return wd, jobs


def test_every_probe_and_training_ran_as_a_completed_slurm_job(dag_on_slurm):
    wd, jobs = dag_on_slurm
    probes = {c for c in jobs if c.startswith("rule_probe")}
    assert len(probes) == 2, jobs  # partial search: the 4 corners, in one job per N
    # the checkpoint the probes waited on, a job of its own (the partition: the profile names none)
    assert "rule_memprobe_wildcards_default" in jobs, jobs
    # probe.exclusive (default true): every probe job asked for its node alone; the memory probe did
    # not
    submit = dict(
        line.split("|", 1)
        for line in sacct(
            "-X", "-o", "JobID,SubmitLine%500", "-j", ",".join(j for j, _ in jobs.values())
        ).splitlines()
        if line
    )
    assert all("--exclusive" in submit[jobs[c][0]] for c in probes), submit
    assert "--exclusive" not in submit[jobs["rule_memprobe_wildcards_default"][0]]
    # training: the local train rule ran `tula launch`, which submitted one submitit job (not a rule
    # job)
    assert "tula-train" in jobs and not any(c.startswith("rule_launch") for c in jobs), jobs
    assert all(state == "COMPLETED" for _, state in jobs.values()), jobs
    # local rules
    assert not any(c.startswith(("rule_aggregate", "rule_fit", "rule_select")) for c in jobs)
    res = wd / "results"
    sel = json.loads((res / "selection.json").read_text())["selected"]
    final = json.loads((res / "train" / "final.json").read_text())
    assert (final["workers"], final["global_batch"]) == (
        sel["workers"],
        sel["global_batch"],
    ) and final["steps"] > 0
    # N {1,2} x B {32,64,128}
    assert final["backend"] == "gloo" and len(pd.read_csv(res / "predictions.csv")) == 6
    # the trained model learnt: digits (10 classes, chance 0.10) stored as uint8, 2 epochs,
    # reach what they reach at this point, recorded (tests/bounds.py, tests/accuracy.json)
    assert final["dataset"].startswith("npz:")
    n, b = final["workers"], final["global_batch"]
    check_accuracy(f"uint8 digits N{n} B{b}", final["final_test_acc"])
    assert f"Use N = {sel['workers']}" in (res / "report.html").read_text()
    assert (res / "plots" / "time_vs_batch.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    att = json.loads((wd / "results" / "train" / "attempts.json").read_text())
    assert att["executor"] == "slurm" and att["attempts"][0]["job_id"] == jobs["tula-train"][0]
    # job folder and logs under results/train
    assert list((wd / "results" / "train" / "submitit").glob("*_0_log.out"))


def test_failed_probe_under_slurm_is_recorded_and_dag_finishes(dag_on_slurm):
    wd, _ = dag_on_slurm
    m = pd.read_csv(wd / "results" / "measurements.csv")
    assert (
        m.query("source == 'probe' and workers == 2 and global_batch == 128")["status"].item()
        == "oom"
    )
    # the corner fell back to the next smaller batch inside the same SLURM job
    assert (
        m.query("source == 'probe' and workers == 2 and global_batch == 64")["status"].item()
        == "ok"
    )
    sel = json.loads((wd / "results" / "selection.json").read_text())
    assert (sel["selected"]["workers"], sel["selected"]["global_batch"]) != (2, 128)


def test_multi_task_probe_in_the_dag_used_srun(dag_on_slurm):
    wd, jobs = dag_on_slurm
    rec = json.loads((wd / OWN / "probes" / "N2" / "B32.json").read_text())
    assert (
        rec["status"] == "ok"
        and rec["env"]["launcher"] == "slurm"
        and rec["env"]["world_size"] == 2
    )
    job_id = next(j for c, (j, _) in jobs.items() if c == "rule_probe_wildcards_default_2")
    # the job's 2-task srun steps: the launch over its batches (cut short by the injected OOM at
    # B = 128, which ends its step) and the fallback's launch, which completed
    steps = sacct("-j", job_id, "-o", "JobID,NTasks,State")
    assert re.search(rf"^{job_id}\.\d+\|2\|COMPLETED$", steps, re.M), steps


def _launch_on_slurm_and_interrupt(tiny_raw, tmp_path, interrupt: list[str], **train) -> str:
    """`tula launch` on the cluster (12 epochs, N=2 on the one node; ``train``'s keys set);
    once two epochs are done, run ``interrupt + [job id]``; wait for launch to finish. Returns
    the job id."""
    tiny_raw["workload"]["epochs"] = 12
    tiny_raw["train"].update(train)
    tiny_raw.setdefault("cluster", {})["workers_per_node"] = 2
    tiny_raw["launch"] = {
        "executor": "slurm",
        "slurm_account": "root",
        "timeout_min": 10,
        "poll_s": 1,
        "checkpoint_every_steps": 5,
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tiny_raw))
    (tmp_path / "selection.json").write_text(json.dumps(selection_json(2, 64)))
    log = open(tmp_path / "launch.log", "w")
    proc = subprocess.Popen(
        [
            "tula",
            "launch",
            "--config",
            "config.yaml",
            "--selection",
            "selection.json",
            "--out-dir",
            "train",
        ],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.time() + 180
        metrics = tmp_path / "train" / "metrics.csv"
        while not (metrics.exists() and len(pd.read_csv(metrics)) >= 2):  # two epochs done: mid-run
            assert proc.poll() is None and time.time() < deadline, (
                tmp_path / "launch.log"
            ).read_text()
            time.sleep(0.5)
        job = json.loads((tmp_path / "train" / "attempts.json").read_text())["attempts"][0][
            "job_id"
        ]
        subprocess.run([*interrupt, job], check=True)
        assert proc.wait(timeout=300) == 0, (tmp_path / "launch.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    return job


def _check_resumed_and_completed(tmp_path, job: str, outcome: str, signal_name: str) -> None:
    (att,) = json.loads((tmp_path / "train" / "attempts.json").read_text())["attempts"]
    first, second = att["segments"]
    assert (
        att["outcome"] == "completed"
        and first["outcome"] == outcome
        and signal_name in first["reason"]
    )
    assert 2 * 23 <= first["end_step"] < 12 * 23 and second["start_step"] == first["end_step"]
    final = json.loads((tmp_path / "train" / "final.json").read_text())
    assert final["steps"] == 12 * 23 and list(
        pd.read_csv(tmp_path / "train" / "metrics.csv")["epoch"]
    ) == list(range(1, 13))
    assert "REQUEUED" in sacct("-D", "-X", "-j", job, "-o", "State")  # SLURM ran the same job twice
    assert "resumed from the checkpoint of step" in (tmp_path / "launch.log").read_text()


@pytest.mark.training
def test_scontrol_requeue_resumes_the_training_job_from_its_checkpoint(
    slurm_cluster, tiny_raw, tmp_path, venv_path, user_pythonpath
):
    """`scontrol requeue` of the running training job: SLURM sends TERM, every rank checkpoints at
    the next step boundary, SLURM runs the job again, it resumes from that checkpoint and
    completes. The job trains with the user's optimizer and schedule given as import paths
    (tests/user_workload.py, imported in the job): both resume where they stopped."""
    user = {"optimizer": "user_workload:nesterov_sgd", "schedule": "user_workload:quarters"}
    job = _launch_on_slurm_and_interrupt(tiny_raw, tmp_path, ["scontrol", "requeue"], **user)
    _check_resumed_and_completed(tmp_path, job, "stopped", "SIGTERM")
    steps, per_epoch = 12 * 23, 23
    loaded, _ = load_latest(tmp_path / "train" / "checkpoints")
    state = loaded.state
    assert all(g["nesterov"] for g in state["optimizer"]["param_groups"])  # the user's optimizer
    # the user's StepLR over the whole run, stepped once a step across the requeue
    schedule = state["scheduler"]  # the run's steps, and the user's scheduler's own state
    assert schedule["steps"] == steps and schedule["scheduler"]["step_size"] == steps // 4
    assert schedule["scheduler"]["last_epoch"] == loaded.step == steps
    # each epoch's LR: halved after each quarter of the run, never back at its start after
    # the resume (a schedule built anew there would be)
    lr = pd.read_csv(tmp_path / "train" / "metrics.csv")["lr"].tolist()
    halvings = [e * per_epoch // (steps // 4) for e in range(1, 13)]
    assert lr == [lr[0] * 0.5**h for h in halvings], lr


@pytest.mark.training
def test_preemption_signal_checkpoints_and_submitit_requeues_on_slurm(
    slurm_cluster, tiny_raw, tmp_path, venv_path
):
    """USR2, what SLURM sends before the time limit (submitit's --signal=USR2@...) or on
    preemption: the ranks checkpoint, submitit's handler runs `scontrol requeue` from inside the
    job, and the requeued job resumes from the checkpoint."""
    job = _launch_on_slurm_and_interrupt(tiny_raw, tmp_path, ["scancel", "--signal=USR2"])
    _check_resumed_and_completed(tmp_path, job, "requeued", "SIGUSR2")
    assert (
        "#SBATCH --signal=USR2@120"
        in next((tmp_path / "train" / "submitit").glob("*_submission.sh")).read_text()
    )


def test_a_partition_or_feature_the_cluster_lacks_is_a_clear_error(
    slurm_cluster, tiny_raw, tmp_path, venv_path
):

    tiny_raw.setdefault("cluster", {})["workers_per_node"] = 2
    tiny_raw["launch"] = {
        "executor": "slurm",
        "slurm_partition": "no_such_partition",
        "slurm_account": "root",
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tiny_raw))
    (tmp_path / "selection.json").write_text(json.dumps(selection_json(2, 64)))
    # the preflight knows the cluster's partitions before sbatch is asked
    with pytest.raises(
        RuntimeError,
        match=r"partition 'no_such_partition' does not exist on this cluster \(it has: "
        r"debug\): fix launch.slurm_partition",
    ):
        train_from_files(tmp_path / "config.yaml", tmp_path / "selection.json", tmp_path / "train")
    # what only sbatch knows (here a node feature no node has) is sbatch's own error, named
    tiny_raw["launch"] = {
        "executor": "slurm",
        "slurm_account": "root",
        "slurm_additional": {"constraint": "no_such_feature"},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tiny_raw))
    with pytest.raises(
        RuntimeError,
        match=r"sbatch refused the training job: .*[Ff]eature.*launch.slurm_additional",
    ):
        train_from_files(tmp_path / "config.yaml", tmp_path / "selection.json", tmp_path / "train2")


@pytest.mark.training
def test_a_rerun_after_the_launcher_died_reattaches_to_the_running_job(
    slurm_cluster, tiny_raw, tmp_path, venv_path
):
    """`tula launch` killed -9 (lost login session) while its job runs: running it again watches
    that same job to the end instead of submitting a second one."""
    tiny_raw["workload"]["epochs"] = 12
    tiny_raw.setdefault("cluster", {})["workers_per_node"] = 2
    tiny_raw["launch"] = {
        "executor": "slurm",
        "slurm_account": "root",
        "timeout_min": 10,
        "poll_s": 1,
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tiny_raw))
    (tmp_path / "selection.json").write_text(json.dumps(selection_json(2, 64)))
    cmd = [
        "tula",
        "launch",
        "--config",
        "config.yaml",
        "--selection",
        "selection.json",
        "--out-dir",
        "train",
    ]
    first = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    attempts = tmp_path / "train" / "attempts.json"
    deadline = time.time() + 120
    while not (attempts.exists() and json.loads(attempts.read_text())["attempts"]):
        assert first.poll() is None and time.time() < deadline
        time.sleep(0.3)
    first.kill()  # SIGKILL: no chance to cancel the job
    first.wait()
    job = json.loads(attempts.read_text())["attempts"][0]["job_id"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"re-attached to job {job}" in r.stdout
    rec = json.loads(attempts.read_text())
    assert [a["job_id"] for a in rec["attempts"]] == [job] and rec["outcome"] == "completed"
    assert json.loads((tmp_path / "train" / "final.json").read_text())["steps"] == 12 * 23
    mine = [
        line
        for line in sacct("-X", "-S", "now-10minutes", "-o", "JobID,JobName,WorkDir").splitlines()
        if "tula-train" in line and str(tmp_path) in line
    ]
    assert len(mine) == 1, mine  # one job, never two


@pytest.mark.dag
def test_the_generalization_suite_runs_each_cell_as_a_slurm_job(slurm_cluster, tmp_path):
    """`snakemake --profile … compare`: every (workload, B, method, seed) is a SLURM job of its
    own."""
    copy_workflow(tmp_path)
    (tmp_path / "workflow" / "config.yaml").write_text("{}\n")
    slurm_test_profile(tmp_path)
    suite = {
        "compare": {
            "workloads": [{"model": "small_cnn", "dataset": "digits", "target_accuracy": 0.5}],
            "batches": [64, 128],
            "methods": ["ags"],
            "seeds": 1,
            "workers": 2,
            "epochs": 1,
        },
        "cluster": {"workers_per_node": 2},
    }  # the test cluster has one node
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    env = venv_env()
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 2))
    r = subprocess.run(
        [
            "timeout",
            "-s",
            "INT",
            "600",
            *SLURM_SNAKEMAKE,
            "compare",
            "--profile",
            "profiles/test",
            "--configfile",
            "suite.yaml",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    rows = [
        line.split("|")
        for line in sacct("-X", "-S", started, "-o", "JobID,JobName%100,State").splitlines()
        if line
    ]
    jobs = {
        name: (job_id, state) for job_id, name, state in rows if name.startswith("tula-compare-")
    }
    assert sorted(jobs) == [
        "tula-compare-small_cnn__digits__B128__ags__s0",
        "tula-compare-small_cnn__digits__B64__ags__s0",
    ], rows
    assert all(state == "COMPLETED" for _, state in jobs.values()), jobs
    df = pd.read_csv(tmp_path / "results" / "compare" / "accuracy.csv")
    assert (df["status"] == "ok").all() and len(df) == 2
    for name, (job_id, _) in jobs.items():
        run = tmp_path / "results" / "compare" / "runs" / name.removeprefix("tula-compare-")
        att = json.loads((run / "attempts.json").read_text())
        assert att["executor"] == "slurm" and att["attempts"][0]["job_id"] == job_id
        assert json.loads((run / "final.json").read_text())["workers"] == 2
        steps = [
            line.split("|")
            for line in sacct("-j", job_id, "-o", "JobID,NTasks,State").splitlines()
            if line
        ]
        # a 2-task step: both workers
        assert ["2", "COMPLETED"] in [s[1:] for s in steps if "." in s[0]], steps
