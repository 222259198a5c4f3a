"""Process groups (tula.runtime.group.dist): the rank and rendezvous of a worker under torchrun
and under SLURM's srun, and the backend that follows the device."""

import os

import pandas as pd
import pytest

from conftest import train_from_files
from selections import selection_json
from tula import config
from tula.runtime.group import dist
from tula.slurm import rendezvous


def test_torchrun_environment():
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
    }
    w = dist.worker_env(env)
    assert (w.rank, w.world_size, w.local_rank, w.master_addr, w.master_port, w.launcher) == (
        1,
        2,
        1,
        "10.0.0.1",
        29400,
        "torchrun",
    )


def test_slurm_environment_derives_master_and_port():
    env = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_JOB_ID": "123456",
    }
    w = dist.worker_env(env)
    assert (w.rank, w.world_size, w.local_rank, w.launcher) == (3, 4, 1, "slurm")
    assert w.master_addr == "gpu07"
    assert w.master_port == rendezvous.master_port("123456") == 10000 + 123456 % 22768


def test_the_rendezvous_port_lies_below_the_ephemeral_range():
    """A port an outgoing connection can hold is never chosen: a relaunched production job
    failed in CI with EADDRINUSE on submitit's random port 47220."""
    low, _ = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    ports = [rendezvous.master_port(str(j)) for j in range(0, 4_000_000, 997)] + [
        rendezvous.master_port("4242_7")
    ]
    assert all(10000 <= p < min(low, rendezvous.EPHEMERAL_LOW) for p in ports)
    assert rendezvous.master_port("4242_7") == rendezvous.master_port("42427")
    assert len(set(ports)) > 3000  # spread, not one port for every job


@pytest.mark.training
def test_comm_env_is_set_alike_in_probe_and_production_workers_and_recorded(
    tiny_raw, tmp_path, venv_path, monkeypatch
):
    """hardware.comm_env reaches every worker of a real 2-worker probe and a real 2-worker
    production job (gloo over loopback), each records what it ran with, and the report says
    they match."""
    import yaml

    from tula.io import write_json
    from tula.model.measurements import comm_env_text
    from tula.stages import probe
    from tula.stages.report.sections import comm_env_section

    for k in [k for k in os.environ if k.startswith(dist.COMM_PREFIXES)]:
        monkeypatch.delenv(k)
    tiny_raw["hardware"] = {"comm_env": {"GLOO_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "WARN"}}
    tiny_raw["launch"] = {"executor": "local", "poll_s": 0.5}
    tiny_raw["workload"]["epochs"] = 1
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(tiny_raw))
    rec = probe.run(tmp_path / "c.yaml", 2, 64, tmp_path / "N2_B64.json")
    assert rec["status"] == "ok", rec.get("error")
    # no NCCL_ALGO; the one variable Tula sets is what torchrun (the probe's launcher here) sets
    # and submitit (production's) does not
    expect = {
        "GLOO_SOCKET_IFNAME": "lo",
        "NCCL_DEBUG": "WARN",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    assert rec["env"]["comm_env"] == expect
    # the layout of cluster.workers_per_node=1 (the paper's), whatever machine ran it
    assert rec["nodes"] == 2
    write_json(tmp_path / "sel.json", selection_json(2, 64))
    final = train_from_files(tmp_path / "c.yaml", tmp_path / "sel.json", tmp_path / "train")
    assert final["comm_env"] == expect
    meas = pd.DataFrame({"source": ["probe"], "comm_env": [comm_env_text(rec["env"])]})
    assert (
        "GLOO_SOCKET_IFNAME=lo, NCCL_DEBUG=WARN, TORCH_NCCL_ASYNC_ERROR_HANDLING=1"
        in comm_env_section(meas, final)
    )
    assert "not the same" not in comm_env_section(meas, final)
    assert "not the same" in comm_env_section(meas, {**final, "comm_env": {"NCCL_ALGO": "Tree"}})


def test_comm_env_names_only_communication_variables():
    with pytest.raises(config.ConfigError, match="hardware.comm_env"):
        config.from_dict({"hardware": {"comm_env": {"PATH": "/tmp"}}})
    assert config.from_dict(
        {"hardware": {"comm_env": {"NCCL_ALGO": "Ring"}}}
    ).hardware.comm_env == {"NCCL_ALGO": "Ring"}
