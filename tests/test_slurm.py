"""The SLURM package (tula.slurm): the shape of an N-worker job, Snakemake's resources for
it, the controller's answers parsed from recorded scontrol/sinfo text, and the same queries
against the real one-node test cluster (scripts/slurm-cluster.sh)."""

import shutil
import subprocess
from types import SimpleNamespace

import pytest

from conftest import GPU_NODES, GPU_PARTITION
from tula import config
from tula.production import submission
from tula.slurm import accounting, partition_info, plugin_patch, rendezvous, shapes


def test_nodelist_parsing_without_scontrol(monkeypatch):
    monkeypatch.setattr(rendezvous.shutil, "which", lambda _: None)
    assert rendezvous.master_addr("node[01-04],gpu7") == "node01"
    assert rendezvous.master_addr("node[3,5]") == "node3"
    assert rendezvous.master_addr("login1") == "login1"


def test_launcher_choice_follows_the_allocation():
    job = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"}
    assert rendezvous.in_allocation(2, job)  # inside sbatch -n 2: srun the workers
    assert not rendezvous.in_allocation(4, job)  # too few tasks: torchrun on this node
    assert not rendezvous.in_allocation(2, {**job, "SLURM_STEP_ID": "0"})  # already a job step
    assert not rendezvous.in_allocation(1, {})  # no SLURM at all


def test_allocation_size_from_scontrol_when_snakemake_cleared_the_environment(monkeypatch):
    monkeypatch.setattr(accounting, "job_tasks", lambda job_id: {"42": 4}[job_id])
    assert rendezvous.in_allocation(4, {"SLURM_JOB_ID": "42"})
    assert not rendezvous.in_allocation(8, {"SLURM_JOB_ID": "42"})


def test_job_resources_map_workers_to_tasks_nodes_and_gpus():
    cfg = config.from_dict(
        {
            "grid": {"workers": [1, 8]},
            "cluster": {"workers_per_node": 4},
            "hardware": {"device": "cuda"},
        }
    )
    r = shapes.job_resources(cfg, 8, runtime_min=15)
    assert r == {
        "tasks": 8,
        "nodes": 2,
        "mpi": "srun",
        "cpus_per_task": 1,
        "gres": "gpu:4",
        "runtime": 15,
        "slurm_extra": None,
    }
    # probe.exclusive
    assert shapes.job_resources(cfg, 8, 15, exclusive=True)["slurm_extra"] == "--exclusive"
    one = shapes.job_resources(cfg, 1, runtime_min=15)
    # plugin: mpi needs tasks > 1
    assert one["mpi"] is None and one["nodes"] == 1 and one["gres"] == "gpu:1"
    cpu = shapes.job_resources(config.from_dict({}), 3, 5)
    assert cpu["gres"] is None and cpu["nodes"] == 3  # paper's setup: 1 worker per node


def test_slurm_time_limits_and_gres_parse():
    assert [
        partition_info.parse_time_min(t)
        for t in (
            "UNLIMITED",
            "INFINITE",
            "30",
            "30:30",
            "02:00:00",
            "1-00:00:00",
            "2-12",
            "1-01:30",
        )
    ] == [None, None, 30, 31, 120, 1440, 3600, 1530]
    assert [
        partition_info.gpus_of(g)
        for g in ("gpu:4", "gpu:a100:4(S:0-1)", "gpu:v100:2,gpu:t4:1", "(null)", "mps:100")
    ] == [4, 4, 3, 0, 0]
    p = partition_info.parse_partition(GPU_PARTITION, GPU_NODES)
    assert (p.name, p.total_nodes, p.max_nodes, p.max_time_min) == ("gpu", 6, 4, 2880)
    # g01 listed twice counts once
    assert sorted(p.node_gpus) == [0, 3, 4, 4, 4, 4] and p.node_cpus == [32] * 6


def test_job_shape_one_task_per_gpu(tiny_raw):
    tiny_raw.setdefault("cluster", {})["workers_per_node"] = 4
    tiny_raw["hardware"] = {"device": "cuda", "backend": "nccl"}
    cfg = config.from_dict(tiny_raw)
    assert shapes.job_shape(cfg, 8) == shapes.JobShape(
        nodes=2, tasks_per_node=4, cpus_per_task=1, gpus_per_node=4
    )
    assert shapes.job_shape(cfg, 2) == shapes.JobShape(1, 2, 1, 2)
    with pytest.raises(
        ValueError, match=r"N=6 does not fill whole nodes of cluster.workers_per_node=4"
    ):
        shapes.job_shape(cfg, 6)


@pytest.mark.parametrize(
    "per_node, workers",
    [(1, [1, 2, 4, 16]), (4, [1, 2, 4, 8, 16]), (6, [1, 2, 4]), (8, [1, 2, 4, 8, 16, 32])],
)
def test_probe_and_production_ask_for_one_shape(per_node, workers, tmp_path, monkeypatch):
    """Every grid N of 1-, 4-, 6- and 8-GPU nodes: the probe rule's resources (sbatch through the
    Snakemake SLURM plugin) and the production job's submitit parameters are one layout. Both
    are pure functions of the config: with no sbatch, srun or scontrol on PATH (as on a laptop
    without SLURM) they give the same answer."""
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no SLURM command to be found
    assert not any(shutil.which(c) for c in ("sbatch", "srun", "scontrol", "sinfo"))
    # 6-GPU nodes: B is a power of two, so no N of whole 6-worker nodes divides it; N <= 6 shares
    # one node
    cfg = config.from_dict(
        {
            "grid": {"workers": workers, "batch_min": 32, "batch_max": 2048},
            "cluster": {"workers_per_node": per_node},
            "hardware": {"device": "cuda"},
        }
    )
    for n in cfg.grid.workers:
        probe = shapes.job_resources(cfg, n, runtime_min=15, exclusive=True)
        params = submission.executor_parameters(cfg, "slurm", n, 30)
        prod = (
            params["nodes"],
            params["tasks_per_node"],
            params.get("gpus_per_node", 0),
            params["cpus_per_task"],
        )
        assert (
            probe["nodes"],
            probe["tasks"] // probe["nodes"],
            int(probe["gres"].split(":")[1]),
            probe["cpus_per_task"],
        ) == prod, n
        assert (
            probe["tasks"] == n and prod[0] == max(1, n // per_node) and prod[1] == min(n, per_node)
        )


def test_submitting_to_slurm_without_sbatch_is_refused_naming_the_key(tmp_path, monkeypatch):
    """Where a job is really submitted, a machine without SLURM is told what to change; the
    shape itself (above) needs no SLURM."""
    monkeypatch.setenv("PATH", str(tmp_path))
    cfg = config.from_dict({})
    with pytest.raises(RuntimeError, match=r"'launch.executor' is slurm but sbatch is not on PATH"):
        submission.make_executor(cfg, "slurm", tmp_path, 2, 30)
    assert submission.executor_parameters(cfg, "slurm", 2, 30)["nodes"] == 2  # 1 worker a node


def test_grid_that_does_not_fill_nodes_is_refused_naming_the_key():
    with pytest.raises(
        config.ConfigError,
        match=r"grid.workers': N=6 does not fill whole nodes of "
        r"cluster.workers_per_node=4.*use a multiple of 4",
    ):
        config.from_dict({"grid": {"workers": [1, 6]}, "cluster": {"workers_per_node": 4}})


def test_scontrol_reports_the_allocation_and_the_job_state(slurm_cluster, tmp_path):
    job = subprocess.run(
        ["sbatch", "--parsable", "-n", "2", "-o", "/dev/null", "--wrap", "sleep 5"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        assert accounting.job_tasks(job) == 2
        assert accounting.job_state(job) in ("PENDING", "RUNNING")
    finally:
        subprocess.run(["scancel", job], check=False)


@pytest.mark.slurm
def test_the_test_clusters_default_partition_is_read_as_scontrol_and_sinfo_describe_it(
    slurm_cluster,
):
    import os

    part = partition_info.read_partition(None)
    sinfo = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%c"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert part.state == "UP" and part.total_nodes == len(sinfo) == 1
    assert (
        part.node_cpus == [int(sinfo[0])]
        and part.node_gpus == [0]
        and part.node_cpus[0] == os.cpu_count()
    )
    # the node's memory as slurm.conf gives it (RealMemory), what sbatch --mem is checked against
    conf = subprocess.run(
        ["scontrol", "show", "node", "-o"], capture_output=True, text=True, check=True
    ).stdout
    real = int(conf.split("RealMemory=", 1)[1].split()[0])
    assert part.node_mem_mb == [real] and real > 0
    with pytest.raises(
        partition_info.PreflightError, match="partition 'no_such' does not exist on this cluster"
    ):
        partition_info.read_partition("no_such")


class _Resources(dict):
    __getattr__ = dict.get


@pytest.mark.slurm
def test_the_plugins_failed_node_exclusion_keeps_only_the_nodes_the_user_named(slurm_cluster):
    """snakemake-executor-plugin-slurm excludes every node a NODE_FAIL job listed from later
    submissions, 'None assigned' (a requeued job's) included, which breaks every later sbatch;
    and excluding a node while it is down makes a two-node job on a two-node partition a
    request sbatch rejects (seen in CI), where SLURM would hold it until the node is back.
    Narrowed, no failed node is excluded, up or drained; the user's own list still is."""
    import snakemake_executor_plugin_slurm as plugin

    node = partition_info.read_partition(None).node_names[0]
    plugin_patch.keep_exclusions_to_named_nodes()
    plugin_patch.keep_exclusions_to_named_nodes()  # once only: the wrapper is not wrapped again
    assert plugin.get_submit_command.__name__ == "narrowed_submit_command"
    job = SimpleNamespace(resources=_Resources(runtime=5), threads=1)
    params = {
        "run_uuid": "u",
        "slurm_logfile": "l",
        "comment_str": "c",
        "account": "",
        "partition": "",
        "workdir": "",
    }

    def excluded(settings=None) -> str:
        call = plugin.get_submit_command(
            job, params, settings=settings, failed_nodes={"None assigned", node}
        )
        return call.split("--exclude=")[1].split()[0] if "--exclude=" in call else ""

    assert excluded() == ""
    named = _Resources(exclude_failed_nodes="gpu07, gpu08")  # the other settings unset
    assert sorted(excluded(named).split(",")) == ["gpu07", "gpu08"]
    subprocess.run(
        ["scontrol", "update", f"nodename={node}", "state=drain", "reason=tula test"], check=True
    )
    try:  # drained: SLURM keeps it out by itself, and the submission does not name it
        assert excluded() == ""
        r = subprocess.run(
            ["sbatch", "--parsable", "-N", "1", "--wrap", "true"], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr  # accepted, held until the node is back
        subprocess.run(["scancel", r.stdout.strip().split(";")[0]], check=True)
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=True)
