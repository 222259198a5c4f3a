from tula import config, slurm
from tula.runtime import dist


def test_torchrun_environment():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}
    w = dist.worker_env(env)
    assert (w.rank, w.world_size, w.local_rank, w.master_addr, w.master_port, w.launcher) == (
        1, 2, 1, "10.0.0.1", 29400, "torchrun")  # fmt: skip


def test_slurm_environment_derives_master_and_port():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
           "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "123456"}  # fmt: skip
    w = dist.worker_env(env)
    assert (w.rank, w.world_size, w.local_rank, w.launcher) == (3, 4, 1, "slurm")
    assert w.master_addr == "gpu07"
    assert w.master_port == slurm.master_port("123456") == 15000 + 123456 % 20000


def test_nodelist_parsing_without_scontrol(monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda _: None)
    assert slurm.master_addr("node[01-04],gpu7") == "node01"
    assert slurm.master_addr("node[3,5]") == "node3"
    assert slurm.master_addr("login1") == "login1"


def test_backend_follows_device():
    hw = config.from_dict({}).hardware
    import torch

    assert dist.resolve_backend(hw, torch.device("cpu")) == "gloo"
    assert dist.resolve_backend(hw, torch.device("cuda", 0)) == "nccl"


def test_launcher_choice_follows_the_allocation():
    job = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"}
    assert slurm.in_allocation(2, job)  # inside sbatch -n 2: srun the workers
    assert not slurm.in_allocation(4, job)  # too few tasks: torchrun on this node
    assert not slurm.in_allocation(2, {**job, "SLURM_STEP_ID": "0"})  # already a job step
    assert not slurm.in_allocation(1, {})  # no SLURM at all


def test_allocation_size_from_scontrol_when_snakemake_cleared_the_environment(monkeypatch):
    monkeypatch.setattr(slurm, "job_tasks", lambda job_id: {"42": 4}[job_id])
    assert slurm.in_allocation(4, {"SLURM_JOB_ID": "42"})
    assert not slurm.in_allocation(8, {"SLURM_JOB_ID": "42"})


def test_job_resources_map_workers_to_tasks_nodes_and_gpus():
    cfg = config.from_dict({"grid": {"nodes": [1, 8], "workers_per_node": 4}, "hardware": {"device": "cuda"}})
    r = slurm.job_resources(cfg, 8, runtime_min=15)
    assert r == {"tasks": 8, "nodes": 2, "mpi": "srun", "cpus_per_task": 1, "gres": "gpu:4", "runtime": 15,
                 "slurm_extra": None}  # fmt: skip
    assert slurm.job_resources(cfg, 8, 15, exclusive=True)["slurm_extra"] == "--exclusive"  # probe.exclusive
    one = slurm.job_resources(cfg, 1, runtime_min=15)
    assert one["mpi"] is None and one["nodes"] == 1 and one["gres"] == "gpu:1"  # plugin: mpi needs tasks > 1
    cpu = slurm.job_resources(config.from_dict({}), 3, 5)
    assert cpu["gres"] is None and cpu["nodes"] == 3  # paper's setup: 1 worker per node


def test_probe_and_production_workers_get_the_same_thread_environment():
    from tula.workers import THREAD_VARIABLES, worker_environment

    snakemake_like = {v: "2" for v in THREAD_VARIABLES} | {"PATH": "/bin"}  # Snakemake exports the rule's threads
    env = worker_environment(1, snakemake_like)
    assert all(env[v] == "1" for v in THREAD_VARIABLES) and env["PATH"] == "/bin" and env["PYTHONUNBUFFERED"] == "1"
