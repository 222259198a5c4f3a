"""The cluster preflight (tula.preflight): the partition's nodes, CPUs, GPUs and time limit against
what the grid's jobs ask for — parsed from recorded scontrol/sinfo text here, and against
the real one-node test cluster (scripts/slurm-preflight.sh) below."""

import dataclasses
import json
import subprocess
import time

import pytest
import yaml

from conftest import GPU_NODES, GPU_PARTITION, ROOT, TINY, copy_workflow, train_from_files, venv_env
from selections import selection_json
from tula import config, devices, preflight
from tula.io import write_json
from tula.slurm import controller, partition_info, shapes


def _cfg(**over):
    raw = json.loads(json.dumps(TINY))
    for key, value in over.items():
        section, name = key.split("__")
        raw.setdefault(section, {})[name] = value
    return config.from_dict(raw)


def test_problems_name_the_config_keys_to_change():
    p = partition_info.parse_partition(GPU_PARTITION, GPU_NODES)
    cfg = _cfg(
        grid__workers=[1, 8, 16],
        cluster__workers_per_node=8,
        hardware__device="cuda",
        hardware__threads_per_worker=8,
        probe__timeout_s=3600,
    )
    probe = next(n for n in preflight.job_needs(cfg, 1440) if n.what == "the probe at N=16")
    assert (probe.nodes, probe.tasks_per_node, probe.gpus_per_node, probe.cpus_per_node) == (
        2,
        8,
        8,
        64,
    )
    found = preflight.problems(cfg, p, probe)
    assert len(found) == 2
    assert (
        "8 GPU(s) per node (cluster.workers_per_node=8, hardware.device=cuda)" in found[0]
        and "at most 4" in found[0]
    )
    assert "64 CPUs per node" in found[1] and "hardware.threads_per_worker=8" in found[1]
    # 2 workers per node: 16 workers need 8 nodes, above the partition's 6 and MaxNodes=4
    cfg = _cfg(
        grid__workers=[1, 16],
        cluster__workers_per_node=2,
        hardware__device="cuda",
        hardware__threads_per_worker=8,
    )
    (msg,) = preflight.problems(cfg, p, preflight.job_needs(cfg, 1440)[1])
    assert (
        msg.startswith("the probe at N=16 needs 8 node(s)")
        and "allows 4 per job" in msg
        and "grid.workers" in msg
    )
    # a time limit: probes ask for probe.timeout_s + 5 min, training for its runtime
    cfg = _cfg(
        grid__workers=[1, 4],
        cluster__workers_per_node=4,
        hardware__device="cuda",
        probe__timeout_s=3 * 86400,
    )
    needs = preflight.job_needs(cfg, 4000)
    assert ["probe.timeout_s" in m for n in needs for m in preflight.problems(cfg, p, n)] == [
        True,
        True,
        False,
    ]
    (msg,) = preflight.problems(cfg, p, needs[2])
    assert "asks for 4000 min" in msg and "at most 2880 min" in msg and "launch.timeout_min" in msg
    # 2 nodes with 4 A100s: fits
    cfg = _cfg(grid__workers=[1, 8], cluster__workers_per_node=4, hardware__device="cuda")
    assert [preflight.problems(cfg, p, n) for n in preflight.job_needs(cfg, 60)] == [[], [], []]
    # `tula launch` (and each run of the suite) checks the N it trains at, not the grid's largest
    cfg = _cfg(
        grid__workers=[1, 16],
        cluster__workers_per_node=2,
        hardware__device="cuda",
        hardware__threads_per_worker=8,
    )
    train = preflight.job_needs(cfg, 60, train_nodes=4)[2]
    assert (
        train.what == "training at N=4"
        and train.nodes == 2
        and preflight.problems(cfg, p, train) == []
    )


def test_profile_is_read_and_a_bad_one_names_file_and_key(tmp_path):
    got = preflight.read_profile(str(ROOT / "profiles" / "slurm"))
    assert got == {
        "executor": "slurm",
        "probe_partition": None,
        "account": None,
        "train_partition": None,
        "train_runtime_min": 1440,
        "mem_mb": {"memprobe": 16000, "probe": 16000},
    }
    with pytest.raises(preflight.PreflightError, match="no .*config.yaml"):
        preflight.read_profile(str(tmp_path))
    (tmp_path / "config.yaml").write_text("default-resources:\n  runtime: one hour\n")
    with pytest.raises(
        preflight.PreflightError,
        match=r"default-resources.runtime must be a whole number, not 'one hour'",
    ):
        preflight.read_profile(str(tmp_path))
    # a rule's own set-resources win over the defaults, for the probes as for training
    (tmp_path / "config.yaml").write_text(
        "default-resources:\n  slurm_partition: cpu\n  slurm_account: lab\n  runtime: "
        "30\nset-resources:\n  probe:\n    slurm_partition: short\n  launch:\n    slurm_partition: "
        "gpu\n    runtime: 600\n"
    )
    assert preflight.read_profile(str(tmp_path)) == {
        "executor": None,
        "probe_partition": "short",
        "account": "lab",
        "train_partition": "gpu",
        "train_runtime_min": 600,
        "mem_mb": {"memprobe": None, "probe": None},
    }


def test_memory_the_jobs_ask_for_is_checked_against_the_nodes_and_names_its_key():
    """The shipped profile's mem_mb (16000) on nodes of 10.8 GB: refused before anything is
    queued, naming the profile key, where sbatch would have said "Memory specification can not
    be satisfied" at the memory probe; a figure the nodes have passes; training's own
    launch.mem_gb is checked alike; nodes whose memory is not known are not checked."""
    nodes = "n0|2|(null)|idle|none\nn1|2|(null)|idle|none\n"
    line = "PartitionName=lab Default=YES MaxNodes=UNLIMITED MaxTime=UNLIMITED TotalNodes=2"
    part = partition_info.parse_partition(line, nodes, "n0|10800\nn1|10800\n")
    assert part.node_mem_mb == [10800, 10800]
    cfg = _cfg(cluster__workers_per_node=1)
    shipped = preflight.read_profile(str(ROOT / "profiles" / "slurm"))["mem_mb"]
    needs = preflight.job_needs(cfg, 60, profile_mem_mb=shipped)
    found = preflight.problems(cfg, part, needs[0])
    assert found == [
        "the memory probe (1 worker) asks SLURM for 16000 MB per node (sbatch --mem: mem_mb in the "
        "profile (default-resources, or set-resources.memprobe)), but the nodes of partition 'lab' "
        'have at most 10800 MB: sbatch would refuse it ("Memory specification can not be '
        'satisfied"); lower mem_mb in the profile'
    ]
    assert "set-resources.probe" in preflight.problems(cfg, part, needs[1])[0]
    fits = preflight.job_needs(cfg, 60, profile_mem_mb={"memprobe": 1000, "probe": 10800})
    assert [preflight.problems(cfg, part, n) for n in fits] == [[], [], []]
    big = _cfg(cluster__workers_per_node=1, launch__mem_gb=64)
    train = preflight.job_needs(big, 60)[-1]
    assert (
        train.mem_mb == 64 * 1024
        and "lower launch.mem_gb in the config" in (preflight.problems(big, part, train)[0])
    )
    unknown = partition_info.parse_partition(line, nodes)
    assert unknown.node_mem_mb == [] and preflight.problems(cfg, unknown, needs[0]) == []
    # a node sinfo left out of the memory listing: not known, not checked
    assert partition_info.parse_partition(line, nodes, "n0|10800\n").node_mem_mb == []


# -- against the real test cluster ------------------------------------------------------


def _check(tmp_path, raw, *extra):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    return subprocess.run(
        ["tula", "check", "--config-only", "--config", "c.yaml", "--cluster", *extra],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=venv_env(),
    )


@pytest.mark.slurm
def test_check_cluster_refuses_a_profile_asking_more_memory_than_the_nodes_have(
    slurm_cluster, tiny_raw, tmp_path
):
    """The real controller's node memory (RealMemory) against the profile's mem_mb, through
    `tula check --cluster --profile`: the shipped 16000 MB fits this machine's node; 100 times
    the node's memory is refused before anything is queued, naming the profile key."""
    tiny_raw.setdefault("cluster", {})["workers_per_node"] = 2
    shipped = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    real = partition_info.read_partition(None).node_mem_mb[0]
    for mem_mb, ok in (
        (shipped["default-resources"]["mem_mb"], 16000 <= real),
        (100 * real, False),
    ):
        prof = {**shipped, "default-resources": {**shipped["default-resources"], "mem_mb": mem_mb}}
        (tmp_path / "prof").mkdir(exist_ok=True)
        (tmp_path / "prof" / "config.yaml").write_text(yaml.safe_dump(prof))
        r = _check(tmp_path, tiny_raw, "--profile", "prof")
        if ok:
            assert r.returncode == 0, r.stderr
            assert f"({real} MB of memory)" in r.stdout and f", {mem_mb} MB per node" in r.stdout
        else:
            assert r.returncode == 2, r.stdout + r.stderr
            assert (
                f"the memory probe (1 worker) asks SLURM for {mem_mb} MB per node (sbatch --mem: "
                "mem_mb in the profile (default-resources, or set-resources.memprobe)), but the "
                f"nodes of partition 'debug' have at most {real} MB" in r.stderr
            )


@pytest.mark.slurm
def test_check_cluster_refuses_more_nodes_than_the_partition_has(slurm_cluster, tiny_raw, tmp_path):
    # N=2 on 2 nodes; the test cluster has one
    tiny_raw.setdefault("cluster", {})["workers_per_node"] = 1
    r = _check(tmp_path, tiny_raw)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "this grid cannot run on the cluster" in r.stderr
    assert (
        "the probe at N=2 needs 2 node(s) (1 worker(s) per node; cluster.workers_per_node=1), but "
        "partition 'debug' has 1 node(s)"
        in r.stderr
        and "training at N=2 needs 2 node(s)" in r.stderr
    )
    tiny_raw.setdefault("cluster", {})["workers_per_node"] = 2
    r = _check(tmp_path, tiny_raw)
    assert r.returncode == 0, r.stderr
    assert (
        "partition 'debug' (UP): 1 node(s)" in r.stdout
        and "ok: the probe at N=2: 1 node(s) x 2 worker(s)" in r.stdout
    )
    # hardware.device auto (the default) is decided from the partition's GRES: the test cluster has
    # none
    assert "device: hardware.device auto: partition 'debug' has no GPU: CPU and gloo" in r.stdout
    assert "2 CPUs and 0 GPU(s) per node" in r.stdout


def test_device_auto_follows_the_partitions_gpus(monkeypatch):
    """Under SLURM a GPU partition turns auto into CUDA jobs that ask for --gres; a CPU one into
    CPU jobs; an explicit device is kept; an unreadable cluster asks for no GPU and says so."""
    gpu = partition_info.parse_partition(GPU_PARTITION, GPU_NODES)
    cpu = partition_info.parse_partition(GPU_PARTITION.replace("gpu", "cpu"), "c01|64|(null)\n")
    cfg = _cfg(cluster__workers_per_node=4)
    monkeypatch.setattr(
        partition_info, "read_partition", lambda name: {"gpu": gpu, "cpu": cpu}[name]
    )
    d = devices.for_config(cfg, "slurm", "gpu")
    assert (d.device, d.backend) == ("cuda", "nccl") and "partition 'gpu' has 4 GPU(s)" in d.why
    cuda = devices.apply(cfg, d)
    assert (
        shapes.job_resources(cuda, 4)["gres"] == "gpu:4"
        and shapes.job_resources(cfg, 4)["gres"] is None
    )
    d = devices.for_config(cfg, "slurm", "cpu")
    assert (d.device, d.backend) == ("cpu", "gloo")
    assert devices.for_config(_cfg(hardware__device="cuda"), "slurm", "cpu").device == "cuda"

    def unreadable(name):
        raise controller.ClusterUnreadable("scontrol is not on PATH")

    monkeypatch.setattr(partition_info, "read_partition", unreadable)
    d = devices.for_config(cfg, "slurm", None)
    assert d.device == "cpu" and "could not be read" in d.why and "scontrol is not on PATH" in d.why


@pytest.fixture
def short_partition(slurm_cluster):
    """A second partition of the test node with a 10-minute time limit (needs SLURM admin: root)."""
    name = "tula_short"
    made = subprocess.run(
        ["scontrol", "create", f"PartitionName={name}", "Nodes=ALL", "MaxTime=10", "State=UP"],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot create a partition (not a SLURM admin?): {made.stderr.strip()}")
    yield name
    subprocess.run(["scontrol", "delete", f"PartitionName={name}"], check=False)


@pytest.mark.slurm
def test_check_cluster_refuses_jobs_longer_than_the_time_limit(short_partition, tiny_raw, tmp_path):
    tiny_raw.setdefault("cluster", {})["workers_per_node"] = 2
    tiny_raw["probe"]["timeout_s"] = 600  # a probe job asks for 15 min
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "executor": "slurm",
                "default-resources": {"slurm_partition": short_partition, "runtime": 5},
                "set-resources": {"launch": {"runtime": 60}},
            }
        )
    )
    r = _check(tmp_path, tiny_raw, "--profile", str(prof))
    assert r.returncode == 2, r.stdout + r.stderr
    assert (
        f"probes on partition {short_partition}, training on {short_partition} for 60 min"
        in r.stdout
    )
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("  - ")]
    assert len(lines) == 3 and all("allows at most 10 min (MaxTime)" in ln for ln in lines), (
        r.stderr
    )
    assert (
        "the memory probe (1 worker) asks for 15 min" in lines[0]
        and "lower probe.timeout_s" in lines[0]
    )
    assert "training at N=2 asks for 60 min" in lines[2] and "launch.timeout_min" in lines[2]


@pytest.mark.slurm
def test_the_dag_refuses_before_submitting_anything(slurm_cluster, tmp_path):
    """`snakemake --profile ...` under the SLURM executor: the workflow's onstart preflight
    stops a grid the cluster cannot run before the memory probe is submitted."""
    copy_workflow(tmp_path)
    (tmp_path / "workflow" / "config.yaml").write_text(
        (ROOT / "workflow" / "config.yaml").read_text()
    )
    (tmp_path / "tiny.yaml").write_text(
        yaml.safe_dump({**TINY, "cluster": {"workers_per_node": 1}})
    )
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    profile["default-resources"] = {
        **profile["default-resources"],
        "slurm_account": "root",
        "mem_mb": 1000,
    }
    (tmp_path / "prof").mkdir()
    (tmp_path / "prof" / "config.yaml").write_text(yaml.safe_dump(profile))
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 2))
    r = subprocess.run(
        ["snakemake", "--profile", "prof", "--configfile", "tiny.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=venv_env(),
        timeout=300,
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert "this grid cannot run on the cluster" in out and "cluster.workers_per_node=1" in out, (
        out[-3000:]
    )
    submitted = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-S", started, "-o", "JobID,Comment"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(tmp_path) not in submitted and "rule_memory_probe" not in submitted, submitted
    assert not list((tmp_path / "results").glob("**/memory_probe.json"))


@pytest.mark.slurm
def test_tula_launch_refuses_a_training_job_the_partition_cannot_run(
    slurm_cluster, tiny_raw, tmp_path
):
    tiny_raw.setdefault("cluster", {})["workers_per_node"] = 1
    tiny_raw["launch"] = {"executor": "slurm", "slurm_account": "root", "timeout_min": 10}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tiny_raw))
    write_json(tmp_path / "selection.json", selection_json(2, 64))
    with pytest.raises(
        RuntimeError, match=r"training at N=2 needs 2 node\(s\).*cluster.workers_per_node=1"
    ):
        train_from_files(tmp_path / "config.yaml", tmp_path / "selection.json", tmp_path / "train")
    assert not (tmp_path / "train" / "submitit").exists()  # nothing was submitted


def test_a_drained_or_down_node_is_named_with_its_partition_before_anything_is_queued():
    """sinfo's state and reason per node: a job that needs more nodes than can start one now
    is refused, naming the partition, each node that cannot, its state and the admin's reason;
    where enough are left the preflight passes and notes the others."""
    line = "PartitionName=lab TotalNodes=2 MaxNodes=UNLIMITED MaxTime=UNLIMITED State=UP"
    nodes = "tula-n0|2|gpu:2|idle|none\ntula-n1|2|gpu:2|drain|tula drill\n"
    part = partition_info.parse_partition(line, nodes)
    assert part.node_states == ["idle", "drain"] and part.unusable() == [
        "tula-n1 is drain (reason: tula drill)"
    ]
    up = ("mix", "idle~", "alloc")
    for state in ("down*", "idle*", "drng", "maint", "fail", *up):
        ok = partition_info.parse_partition(line, f"a|2|gpu:2|{state}|x\n").can_start(0)
        assert ok is (state in up), state
    cfg = _cfg(grid__workers=[1, 2, 4], cluster__workers_per_node=2)
    four, two = (preflight.job_needs(cfg, 60, n)[-1] for n in (4, 2))
    (msg,) = preflight.problems(cfg, part, four)
    assert "training at N=4 needs 2 node(s), but only 1 node(s) of partition 'lab'" in msg
    assert "tula-n1 is drain (reason: tula drill)" in msg and "state=resume" in msg
    assert preflight.problems(cfg, part, two) == []
    # tula launch waits for lost nodes instead (tula.production.nodes)
    assert preflight.problems(cfg, part, four, node_states=False) == []
    # without the state columns (an older record) every node counts as up
    assert (
        partition_info.parse_partition(line, "tula-n0|2|gpu:2\ntula-n1|2|gpu:2\n").unusable() == []
    )
    report = {"partitions": {"lab": dataclasses.asdict(part)}, "jobs": []}
    assert "note: tula-n1 is drain (reason: tula drill)" in preflight.describe(report)


@pytest.mark.slurm
def test_check_cluster_checks_every_listed_partition_and_names_the_one_that_fails(
    slurm_cluster, tiny_raw, tmp_path
):
    part = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True)
    here = part.stdout.split()[0]
    tiny_raw["cluster"] = {"workers_per_node": 2, "partitions": [{"name": here}]}
    r = _check(tmp_path, tiny_raw)
    assert r.returncode == 0, r.stderr
    assert f"{here}: partition '{here}' (UP): 1 node(s)" in r.stdout
    assert "ok: training at N=2: 1 node(s) x 2 worker(s)" in r.stdout
    # an entry whose partition is not there; one whose nodes cannot hold its jobs (2 nodes at
    # one worker a node, where the partition has one)
    tiny_raw["cluster"]["partitions"] = [{"name": "nope"}, {"name": here, "workers_per_node": 1}]
    r = _check(tmp_path, tiny_raw)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cluster.partitions[0] (nope): partition 'nope' does not exist" in r.stderr
    assert f"cluster.partitions[1] ({here}): this grid cannot run" in r.stderr
    assert "training at N=2 needs 2 node(s)" in r.stderr
