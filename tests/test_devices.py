"""Where the jobs run (tula.devices): one decision of hardware.device and hardware.backend for
every stage, job and launcher. CI has no GPU, so the GPU count is the one thing patched here;
the CPU answers (0 GPUs) run for real in tests/test_dag.py."""

import pytest
import torch

from conftest import TINY
from tula import config, devices
from tula.runtime.group import dist
from tula.stages import check


def _cfg(**hardware):
    return config.from_dict(
        {**TINY, "grid": {**TINY["grid"], "workers": [1, 2]}, "hardware": hardware}
    )


@pytest.mark.parametrize(
    "gpus, device, said",
    [
        (0, "cpu", "this machine has no GPU: CPU and gloo"),
        (
            1,
            "cpu",
            "this machine has 1 GPU(s) but grid.workers goes up to N=2, one GPU per worker: CPU "
            "and gloo",
        ),
        (2, "cuda", "this machine has 2 GPU(s), one for each of up to 2 workers: CUDA"),
        (8, "cuda", "this machine has 8 GPU(s)"),
    ],
)
def test_auto_uses_cuda_only_where_every_grid_point_has_a_gpu_per_worker(gpus, device, said):
    """The shipped default (grid.workers [1, 2]) on a one-GPU machine runs on CPU, not two NCCL
    ranks on one GPU ("Duplicate GPU detected")."""
    d = devices.for_config(_cfg(), "local", gpus=gpus)
    assert (
        d.device == device
        and d.backend == ("nccl" if device == "cuda" else "gloo")
        and said in d.why
    )


def test_cuda_with_too_few_gpus_is_refused_naming_grid_workers():
    with pytest.raises(
        devices.DeviceError,
        match=r"config key 'hardware.device' is cuda, but this machine has 1 "
        r"GPU\(s\) and config key 'grid.workers' goes up to N=2",
    ):
        devices.for_config(_cfg(device="cuda"), "local", gpus=1)
    assert devices.for_config(_cfg(device="cuda"), "local", gpus=2).device == "cuda"
    with pytest.raises(devices.DeviceError, match="config key 'hardware.backend' is nccl"):
        devices.for_config(_cfg(backend="nccl"), "local", gpus=0)
    d = devices.for_config(_cfg(device="cpu"), "local", gpus=4)  # cpu stays cpu
    assert (d.device, d.backend) == ("cpu", "gloo")


def test_a_decided_config_is_kept_as_written():
    """The workflow writes its decision into the snapshot; jobs and tula check read it, not the
    machine they happen to run on."""
    d = devices.for_config(_cfg(), "local", gpus=1)
    decided = devices.apply(_cfg(), d)
    assert devices.for_config(decided, "local", gpus=0) == d
    assert (
        config.from_dict(
            {**TINY, "hardware": {"device": "cpu", "device_why": d.why}}
        ).hardware.device_why
        == d.why
    )


def test_tula_check_says_the_decision_and_refuses_cuda(monkeypatch, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    import yaml

    raw = {**TINY, "grid": {**TINY["grid"], "workers": [1, 2]}}
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.setattr(devices, "local_gpus", lambda: 1)
    check.run(str(path), config_only=True)
    assert (
        "device: hardware.device auto: this machine has 1 GPU(s) but grid.workers goes up to N=2"
        in capsys.readouterr().out
    )
    path.write_text(yaml.safe_dump({**raw, "hardware": {"device": "cuda"}}))
    with pytest.raises(devices.DeviceError, match="grid.workers"):
        check.run(str(path), config_only=True)


def test_a_worker_checks_its_device_against_the_gpus_it_sees(monkeypatch):
    """A worker started by hand decides auto alike; cuda with more workers on this machine than
    GPUs is refused (RuntimeError naming the keys) before NCCL would put two ranks on one GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    one = dist.WorkerEnv(0, 1, 0, "127.0.0.1", 0, "single")
    two = dist.WorkerEnv(1, 2, 1, "127.0.0.1", 0, "torchrun")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    assert dist.resolve_device(_cfg().hardware, one) == (torch.device("cuda", 0), "nccl")
    assert dist.resolve_device(_cfg().hardware, two) == (torch.device("cpu"), "gloo")
    with pytest.raises(RuntimeError, match="grid.workers"):
        dist.resolve_device(_cfg(device="cuda").hardware, two)
    # two nodes of one GPU each: each rank has its GPU
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "1")
    assert dist.resolve_device(_cfg(device="cuda").hardware, two) == (
        torch.device("cuda", 0),
        "nccl",
    )


def test_without_a_gpu_driver_no_torch_is_imported_to_count_none(monkeypatch, tmp_path):
    """No driver file (tula.devices.GPU_DRIVER_FILES): 0 GPUs, said without importing torch,
    which a `snakemake` parse would otherwise pay on every run; with one, torch is asked."""
    import subprocess
    import sys

    monkeypatch.setattr(devices, "GPU_DRIVER_FILES", (str(tmp_path / "none"),))
    assert devices.local_gpus() == 0
    (tmp_path / "nvidiactl").touch()
    monkeypatch.setattr(devices, "GPU_DRIVER_FILES", (str(tmp_path / "nvidiactl"),))
    assert devices.local_gpus() == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    # and for real, in a fresh process: torch imported only where a driver file is there
    code = (
        "import sys; from tula import devices;"
        "n = devices.local_gpus();"
        "driver = devices.gpu_driver_present();"
        "print(n, driver, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    n, driver, imported = int(out[0]), out[1] == "True", out[2] == "True"
    assert imported == driver and (driver or n == 0), out


@pytest.mark.dag
def test_the_workflows_parse_imports_neither_torch_without_a_gpu_nor_kneed(tmp_path):
    """`snakemake -n`, as a user runs it on a login node (and every SLURM job's own Snakemake):
    the parse decides the device without torch where no GPU driver is, and leaves kneed (scipy,
    matplotlib) to the stages that find a knee. Together they were 5 of its 7 CPU seconds."""
    import subprocess

    import yaml

    from conftest import ROOT, copy_workflow, venv_env

    copy_workflow(tmp_path)
    (tmp_path / "workflow" / "config.yaml").write_text(
        (ROOT / "workflow" / "config.yaml").read_text()
    )
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    cmd = ["python", "-X", "importtime", "-m", "snakemake", "-n", "--configfile", "tiny.yaml"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=venv_env())
    assert r.returncode == 0 and "probe" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if "|" in line}
    assert "tula.devices" in imported and "kneed" not in imported
    driver = devices.gpu_driver_present()
    assert ("torch" in imported) == driver, driver
