"""The host allocator every worker sets (tula.runtime.group.dist.steady_host_memory): a training
step's host memory comes back from the process's heap instead of fresh pages from the kernel,
whatever the process ran before, so the compute sweep (a process that ran another batch first)
and production (a fresh process) pay a step alike. Counted in page faults, not in seconds."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT
from tula.runtime.group import dist

STEP_FAULTS = textwrap.dedent(
    """
    import json, os, resource, sys
    from tula import config as config_mod
    from tula.runtime.group import dist
    from tula.runtime.step.replica import Replica
    if sys.argv[1] == "glibc-default":
        # glibc's start held there: its moving threshold may rise during the warm-up (when a
        # larger block happens to be freed), which made the comparison depend on luck
        dist.steady_host_memory = lambda: None
        import ctypes
        ctypes.CDLL(None).mallopt(dist.M_MMAP_THRESHOLD, 128 * 1024)
    cfg = config_mod.load(sys.argv[2])
    _, device, _ = dist.init(cfg.hardware, timeout_s=60)
    r = Replica(cfg, device, 64, 0, 1)
    for _ in range(5):
        r.walk.next_steps(1)
    per_step = []
    for _ in range(15):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        r.walk.next_steps(1)
        per_step.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    # the median step: an epoch's edge (the loader's next epoch) faults pages in either mode
    print(json.dumps({"faults_per_step": sorted(per_step)[len(per_step) // 2], "all": per_step}))
    """
)


def faults_per_step(mode: str, config_path: str, port: int) -> float:
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    out = subprocess.run(
        [sys.executable, "-c", STEP_FAULTS, mode, config_path],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["faults_per_step"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
@pytest.mark.wallclock  # each worker within its subprocess timeout
def test_a_fresh_worker_steps_without_fresh_pages():
    """The default's step at B = 64 in a fresh process: with glibc's own start (a 128 KiB mmap
    threshold that moves, and trims the heap's top past twice it) the step's activations come
    from new pages every step (about a thousand faults per step on this machine); as every
    worker sets it, they come back from the heap."""
    cfg = str(ROOT / "workflow" / "config.yaml")
    default = faults_per_step("glibc-default", cfg, dist._free_port())
    steady = faults_per_step("steady", cfg, dist._free_port())
    assert default > 200, f"glibc's default start faulted only {default:.0f} pages a step"
    assert steady < default / 10, (steady, default)


def test_the_setting_is_made_and_recorded():
    """Made where the C library has mallopt (glibc here), and said in the probe's env."""
    made = dist.steady_host_memory()
    if sys.platform.startswith("linux"):
        assert made == dist.HOST_MALLOC
        assert made["trim_threshold"] >= made["mmap_threshold"] >= 1 << 20
