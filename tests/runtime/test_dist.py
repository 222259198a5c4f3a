"""Process groups (tula.runtime.dist): the rank and rendezvous of a worker under torchrun
and under SLURM's srun, and the backend that follows the device."""

import torch

from tula import config, slurm
from tula.runtime import dist


def test_torchrun_environment():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}
    w = dist.worker_env(env)
    assert (w.rank, w.world_size, w.local_rank, w.master_addr, w.master_port, w.launcher) == (
        1, 2, 1, "10.0.0.1", 29400, "torchrun")  # fmt: skip


def test_backend_follows_device():
    hw = config.from_dict({}).hardware
    assert dist.resolve_backend(hw, torch.device("cpu")) == "gloo"
    assert dist.resolve_backend(hw, torch.device("cuda", 0)) == "nccl"


def test_slurm_environment_derives_master_and_port():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
           "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "123456"}  # fmt: skip
    w = dist.worker_env(env)
    assert (w.rank, w.world_size, w.local_rank, w.launcher) == (3, 4, 1, "slurm")
    assert w.master_addr == "gpu07"
    assert w.master_port == slurm.master_port("123456") == 15000 + 123456 % 20000
