"""A two-node SLURM cluster for real, on the network lab: `scripts/slurm-cluster.sh up --nodes 2`
turns the lab's two namespaces into SLURM nodes (one slurmd each, under its own hostname),
with slurmctld and slurmdbd in the root namespace on the bridge's address. Probes that span
both nodes start their workers through srun on each, and the rendezvous crosses the shaped
link. Needs root; CI runs as root, and there a cluster that cannot be made fails the tests
instead of skipping them. However the tests end, the lab goes and the one-node cluster the
other SLURM tests use comes back (or nothing is left, where none ran before)."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, TINY, slurm_controller_answers

pytestmark = [pytest.mark.slurm, pytest.mark.netlab, pytest.mark.slow]
CLUSTER = ["bash", str(ROOT / "scripts" / "slurm-cluster.sh")]
NODES = ("tula-n0", "tula-n1")
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")


def cluster(*args: str) -> str:
    r = subprocess.run([*CLUSTER, *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def run(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def lab_namespaces() -> list[str]:
    names = run("ip", "netns", "list").split()
    return [n for n in names if n.startswith("tula-n")]


@pytest.fixture(scope="module")
def lab_cluster():
    required = os.environ.get("CI") == "true" or os.environ.get("TULA_REQUIRE_SLURM") == "1"
    missing = [t for t in ("sbatch", "slurmd", "ip", "tc", "nsenter") if not shutil.which(t)]
    if os.geteuid() != 0 or missing:
        why = f"the two-node lab cluster needs root and {missing or 'its tools'}"
        pytest.fail(why + ", which CI has") if required else pytest.skip(why)
    had_one_node = slurm_controller_answers()
    try:
        cluster("up", "--nodes", "2", "--rate", "200mbit", "--slots", "2")
        yield NODES
    finally:
        cluster("up") if had_one_node else cluster("down")
        assert not lab_namespaces(), "the lab's namespaces outlived the tests"
        assert "tula-slurm-lab" not in Path("/etc/hosts").read_text()


def wait_for_job(job_id: str, timeout_s: float = 240) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        out = run("sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State").split()
        if out and out[0] in FINAL:
            return out[0]
        time.sleep(1)
    raise TimeoutError(f"SLURM job {job_id} did not finish in {timeout_s}s")


def sbatch(*args: str) -> str:
    return run("sbatch", "--parsable", *args).strip()


def test_two_nodes_come_up_each_with_its_name_address_and_gpu_slots(lab_cluster, tmp_path):
    rows = run("sinfo", "-h", "-N", "-p", "lab", "-o", "%N %t %c %G").split("\n")
    nodes = sorted(r.split() for r in rows if r.strip())
    assert [n[0] for n in nodes] == list(NODES)
    assert all(n[1] in ("idle", "mix") and n[2] == "2" and n[3] == "gpu:2" for n in nodes), nodes
    # one task on each node: its own hostname (the UTS namespace) and lab address
    out = tmp_path / "where.out"
    job = sbatch(
        "-N2",
        "--ntasks-per-node=1",
        "--gres=gpu:1",
        "-o",
        str(out),
        "--wrap",
        "srun sh -c 'echo $(hostname) $(ip -4 -o addr show dev lab0 | cut -d\" \" -f7)'",
    )
    assert wait_for_job(job) == "COMPLETED", out.read_text()
    seen = sorted(tuple(line.split()) for line in out.read_text().splitlines() if line.strip())
    assert seen == [("tula-n0", "10.77.0.1/24"), ("tula-n1", "10.77.0.2/24")]


def test_a_four_worker_probe_spans_both_nodes_through_srun(lab_cluster, tmp_path):
    """The N = 4 probe's job is the shape Tula asks for (2 nodes x 2 tasks, gpu:2 a node, as
    tula.slurm.job_resources gives it): its workers start through srun on both nodes, the
    master is the first node by name, and the gloo rendezvous crosses the shaped link."""
    from tula import config
    from tula.slurm import job_resources

    raw = {**TINY, "grid": {"workers": [1, 2, 4], "batch_min": 32, "batch_max": 128}}
    raw["cluster"] = {"workers_per_node": 2}
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(yaml.safe_dump(raw))
    shape = job_resources(config.load(cfg_file), 4, runtime_min=10)
    assert (shape["nodes"], shape["tasks"]) == (2, 4)
    rec_file, tula = tmp_path / "N4_B64.json", Path(sys.executable).parent / "tula"
    job = sbatch(
        f"--nodes={shape['nodes']}",
        f"--ntasks={shape['tasks']}",
        "--gres=gpu:2",
        "-o",
        str(tmp_path / "probe-%j.out"),
        "--wrap",
        f"{tula} probe --config {cfg_file} --workers 4 --global-batch 64 --out {rec_file}",
    )
    state = wait_for_job(job)
    log = "\n".join(p.read_text() for p in tmp_path.glob("probe-*.out"))
    assert state == "COMPLETED", log[-3000:]
    rec = json.loads(rec_file.read_text())
    assert rec["status"] == "ok", rec.get("error")
    env = rec["env"]
    assert env["launcher"] == "slurm" and env["world_size"] == 4
    assert sorted(env["hostnames"]) == ["tula-n0", "tula-n0", "tula-n1", "tula-n1"]
    # one 4-task srun step, over both nodes
    steps = run("sacct", "-n", "-P", "-j", job, "-o", "JobID,NTasks,NNodes,State")
    assert f"{job}.0|4|2|COMPLETED" in steps, steps
    assert rec["sync_time_s"] > 0 and rec["step_time_s"] > rec["compute_time_s"]


def test_the_whole_workflow_runs_across_the_two_nodes(lab_cluster, tmp_path):
    """`snakemake --profile` as a user runs it, on the partition `lab`: the N = 4 probes are
    two-node jobs whose workers srun starts on both nodes, the step model is fitted from them,
    and the production job (held to N = 4 by the config's constraint) trains through submitit
    on both nodes. No cluster.netlab: a worker is on its node because that node's slurmd
    started it. hardware.device is cpu: the lab's gpu slots are only counted (on auto, the
    jobs would ask for them and find no GPU, which the workers say)."""
    from conftest import copy_workflow

    copy_workflow(tmp_path)
    (tmp_path / "workflow" / "config.yaml").write_text(
        (ROOT / "workflow" / "config.yaml").read_text()
    )
    lab = {
        **TINY,
        "grid": {"workers": [1, 2, 4], "batch_min": 32, "batch_max": 128},
        "cluster": {"workers_per_node": 2},
        "hardware": {"device": "cpu"},
        "constraints": {"min_workers": 4},
    }
    (tmp_path / "lab.yaml").write_text(yaml.safe_dump(lab))
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    profile["default-resources"] = {
        **profile["default-resources"],
        "slurm_account": "root",
        "slurm_partition": "lab",
        "mem_mb": 1000,
    }
    profile["set-resources"]["launch"]["runtime"] = 10
    profile.update({"slurm-init-seconds-before-status-checks": 2, "latency-wait": 5, "jobs": 4})
    (tmp_path / "profiles" / "lab").mkdir(parents=True)
    (tmp_path / "profiles" / "lab" / "config.yaml").write_text(yaml.safe_dump(profile))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(
        ["timeout", "-s", "INT", "900", "snakemake", "--profile", "profiles/lab"]
        + ["--configfile", "lab.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    res = tmp_path / "results"
    for probe in res.glob("probes/N4_*.json"):
        rec = json.loads(probe.read_text())
        assert rec["status"] == "ok", rec.get("error")
        assert sorted(rec["env"]["hostnames"]) == ["tula-n0", "tula-n0", "tula-n1", "tula-n1"]
    assert list(res.glob("probes/N4_*.json")), "no N = 4 probe ran"
    perf = json.loads((res / "model" / "perf.json").read_text())
    assert perf["workers_per_node"] == 2
    assert {(p["workers"], p["status"]) for p in perf["multi_worker_probes"]} >= {(4, "ok")}
    final = json.loads((res / "train" / "final.json").read_text())
    assert final["workers"] == 4 and final["step_time_ratio"] > 0
    job = json.loads((res / "train" / "attempts.json").read_text())["attempts"][-1]["job_id"]
    steps = run("sacct", "-n", "-P", "-j", job, "-o", "JobID,NTasks,NNodes,NodeList,State")
    assert f"{job}.0|4|2|tula-n[0-1]|COMPLETED" in steps, steps
