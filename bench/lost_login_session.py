"""What a lost login session does to a run under `snakemake --profile slurm`, measured on the
real one-node test cluster (scripts/slurm-cluster.sh up, as root).

1. `snakemake --profile <test profile>` runs the whole workflow in its own session, as on a
   login node; the probes are SLURM jobs, and `tula launch` submits the training job.
2. Once the training job has run some epochs, the session is hung up: SIGHUP to its whole
   process group (snakemake and `tula launch` die on it, with no time to clean up).
3. Is the training job still queued or running? (`squeue`)
4. The same command again: Snakemake refuses, its working directory locked.
5. `snakemake --unlock`, then the same command: does `tula launch` re-attach to the job that
   is still running (no second training job), and does the run complete?

    .venv/bin/python bench/lost_login_session.py [--epochs 150]     # ~7 min

Prints a Markdown table (BENCHMARKS.md "The production job's safety").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from _harness import ROOT, copy_workflow, env, tests_helper


def _snakemake(wd: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["snakemake", *args], cwd=wd, env=env(), capture_output=True, text=True, **kw
    )


def _training_jobs() -> list[str]:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "--name", "tula-train", "-o", "JobID,State"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--epochs",
        type=int,
        default=150,
        help="epochs of the training job (it must outlive the hang-up)",
    )
    a = ap.parse_args()
    if subprocess.run(["scontrol", "ping"], capture_output=True).returncode != 0:
        raise SystemExit(
            "no SLURM controller answers: run `scripts/slurm-cluster.sh up` (as root) first"
        )
    before = set(_training_jobs())
    with tempfile.TemporaryDirectory(prefix="tula-lost-session-") as tmp:
        wd = copy_workflow(Path(tmp) / "wf")
        cfg = yaml.safe_load((ROOT / "workflow" / "config.yaml").read_text())
        cfg["workload"]["epochs"] = a.epochs
        cfg["grid"].update(batch_max=128)
        cfg["cluster"] = {"workers_per_node": 2}  # the test cluster is one 2-core node
        cfg["probe"] = {"warmup_steps": 1, "timed_steps": 3, "time_budget_s": 0.5}
        # 45 steps an epoch: the job trains for a minute or more
        cfg["constraints"] = {"max_batch": 32}
        (wd / "workflow" / "config.yaml").write_text(yaml.safe_dump(cfg))
        prof = tests_helper("slurm_test_profile")(wd, launch_minutes=30)
        log = open(wd / "session.log", "w")
        t0 = time.time()
        # a login shell's job: SIGHUP at its default (under nohup it would be inherited as ignored)
        session = subprocess.Popen(
            ["snakemake", "--profile", prof],
            cwd=wd,
            env=env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
        )
        attempts = wd / "results" / "train" / "attempts.json"
        metrics = wd / "results" / "train" / "metrics.csv"
        # 2 epochs done
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            if session.poll() is not None:
                raise SystemExit(
                    "the run ended before training was under "
                    f"way:\n{(wd / 'session.log').read_text()[-3000:]}"
                )
            time.sleep(1)
        job = json.loads(attempts.read_text())["attempts"][-1]["job_id"]
        running = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
        ).stdout.strip()
        if running != "RUNNING":
            raise SystemExit(
                f"the training job {job} is {running or 'gone'} before the hang-up: raise --epochs"
            )
        hung_up_at = time.time()
        os.killpg(session.pid, signal.SIGHUP)  # the login session is gone
        session.wait()
        time.sleep(3)
        state = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
        ).stdout.strip()
        again = _snakemake(wd, "--profile", prof)
        locked = again.returncode != 0 and "cannot be locked" in again.stdout + again.stderr
        unlock = _snakemake(wd, "--unlock", "--profile", prof)
        t1 = time.time()
        rerun = _snakemake(wd, "--profile", prof)
        launch_log = (wd / "results" / "logs" / "launch.log").read_text()
        final = (
            json.loads((wd / "results" / "train" / "final.json").read_text())
            if rerun.returncode == 0
            else {}
        )
        new_jobs = sorted(set(_training_jobs()) - before)
        rows = [
            (
                "training job after the hang-up",
                f"{state or 'gone'} (job {job}, {hung_up_at - t0:.0f} s into the run)",
            ),
            (
                "the same command again",
                "refused: working directory locked"
                if locked
                else f"rc {again.returncode}: "
                f"{(again.stdout + again.stderr).strip().splitlines()[-1:]}",
            ),
            ("`snakemake --unlock`", f"rc {unlock.returncode}"),
            (
                "the same command after the unlock",
                f"rc {rerun.returncode} after {time.time() - t1:.0f} s",
            ),
            (
                "`tula launch` re-attached to the running job",
                str(f"re-attached to job {job}" in launch_log),
            ),
            ("training jobs submitted in all", f"{len(new_jobs)}: {', '.join(new_jobs)}"),
            (
                "final.json",
                f"{final.get('epochs')} epochs, {final.get('steps')} steps, test accuracy "
                f"{100 * final.get('final_test_acc', 0):.2f} %"
                if final
                else "missing",
            ),
        ]
        print("\n| step | measured |\n|---|---|")
        for what, value in rows:
            print(f"| {what} | {value} |")


if __name__ == "__main__":
    main()
