"""Starting workers (tula.workers): torchrun starts N real processes with the worker
environment (the probe's and the production job's alike), and a launch past its limit is
killed with its whole process group."""

import json
import os
import subprocess
import sys

import pytest

from tula.workers import processes
from tula.workers.processes import THREAD_VARIABLES, worker_environment


def test_probe_and_production_workers_get_the_same_thread_environment():
    # Snakemake exports the rule's threads
    snakemake_like = {v: "2" for v in THREAD_VARIABLES} | {"PATH": "/bin"}
    env = worker_environment(1, snakemake_like)
    assert (
        all(env[v] == "1" for v in THREAD_VARIABLES)
        and env["PATH"] == "/bin"
        and env["PYTHONUNBUFFERED"] == "1"
    )


PROFILED_STEP = """
import torch
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
    (torch.randn(64, 64, requires_grad=True) @ torch.randn(64, 64)).sum().backward()
print("measured")
"""


@pytest.mark.wallclock  # the worker within its subprocess timeout
def test_the_memory_profiler_writes_nothing_into_a_workers_log():
    """The CPU memory measurement runs torch's profiler on every measured step; in the worker
    environment kineto adds nothing to the probe's log, outside it (level 5) it wrote a
    "USDT ... profiler_start" and a "profiler_stop" line per step at torch 2.14."""
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    run = subprocess.run(
        [sys.executable, "-c", PROFILED_STEP],
        env=worker_environment(1, env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and run.stdout.strip() == "measured", run.stderr
    assert "profiler_st" not in run.stderr and "USDT" not in run.stderr, run.stderr
    assert worker_environment(1, {"KINETO_LOG_LEVEL": "2"})["KINETO_LOG_LEVEL"] == "2"


@pytest.mark.slow
def test_torchrun_starts_n_workers_with_the_worker_environment(
    tmp_path, user_pythonpath, monkeypatch
):
    # what Snakemake would export: the workers get threads_per_worker
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    res = processes.start(
        2, ["worker_report", "--result-dir", str(tmp_path)], threads_per_worker=1, timeout_s=120
    )
    assert (res.returncode, res.timed_out) == (0, False) and res.wall_s > 0
    got = [json.loads(processes.result_path(tmp_path, r).read_text()) for r in (0, 1)]
    assert [(g["rank"], g["world"], g["omp"], g["unbuffered"], g["agent"]) for g in got] == [
        (0, 2, "1", "1", True),
        (1, 2, "1", "1", True),
    ]
    assert got[0]["pid"] != got[1]["pid"] != os.getpid()


@pytest.mark.slow
@pytest.mark.parametrize("alone", [True, False])
def test_one_worker_starts_by_itself_only_where_asked(
    tmp_path, user_pythonpath, monkeypatch, alone
):
    """N = 1 off SLURM: the memory probe's worker (``one_alone``) starts with no torchrun agent
    (no rendezvous to run; its start came before the worker's), in the same environment; the
    timing probe's keeps torchrun, as at every other N."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    res = processes.start(
        1,
        ["worker_report", "--result-dir", str(tmp_path)],
        threads_per_worker=1,
        timeout_s=120,
        one_alone=alone,
    )
    assert (res.returncode, res.timed_out) == (0, False)
    got = json.loads(processes.result_path(tmp_path, 0).read_text())
    assert (got["rank"], got["world"], got["omp"], got["unbuffered"], got["agent"]) == (
        0,
        1,
        "1",
        "1",
        not alone,
    )


@pytest.mark.slow
def test_a_launch_past_its_limit_is_killed_with_every_worker(tmp_path, user_pythonpath):
    res = processes.start(
        2,
        ["worker_report", "--result-dir", str(tmp_path), "--sleep", "300"],
        threads_per_worker=1,
        timeout_s=5,
    )
    assert res.timed_out and 5 <= res.wall_s < 60 and res.returncode != 0
    assert not list(tmp_path.glob("rank*.json"))
    left = subprocess.run(
        ["pgrep", "-f", f"worker_report --result-dir {tmp_path}"], capture_output=True, text=True
    )
    assert left.stdout.split() == [], "workers of the killed launch still run"
