"""No host stall in a steady-state step: the CPU must be able to queue step k+1
while the device runs step k, so a steady step reads nothing back from the device. Counted
here on CPU over 10 steady-state steps of every method, by wrapping every Python-level way a
tensor's value reaches the host (``Tensor.item``, ``float(t)``, ``int(t)``, ``bool(t)``,
``.cpu()``, ``.tolist()``, ``.numpy()``) and ``torch.cuda.synchronize``. On the GPU the same
steps ran under ``torch.cuda.set_sync_debug_mode("error")`` with no synchronising call
(bench/gpu_step.py, BENCHMARKS.md "On a GPU").

One read per step is justified: with N > 1 the step's agreement (tula.runtime.group.agreement.
agree_host: an out-of-memory error, a stop signal) all-reduces a small CPU tensor over gloo and
reads it with ``.tolist()``. The flags are what the host already knows, so it never waits for
the device; alone (N = 1) nothing is sent."""

import contextlib
import json
import traceback

import pytest
import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp
from test_replica import one_process_group  # noqa: F401 - the fixture: a one-process gloo group

from conftest import TINY
from tula import config
from tula.runtime.step.replica import Replica

METHODS = ("ags", "lbt", "lrs", "static", "lars", "polo")
READS = ("item", "__float__", "__int__", "__bool__", "__index__", "cpu", "tolist", "numpy")


@contextlib.contextmanager
def counting_host_reads():
    """Every host read of a tensor's value while inside, as (what, where in tula's code: module
    and function, not line, so that a reformat does not move the mark)."""
    seen: list[tuple[str, str]] = []
    saved = {name: getattr(torch.Tensor, name) for name in READS}
    saved_sync = torch.cuda.synchronize

    def where() -> str:
        frames = [f for f in traceback.extract_stack()[:-2] if "/tula/" in f.filename]
        return f"{frames[-1].filename.split('/tula/')[-1]}:{frames[-1].name}" if frames else "?"

    def wrap(name, orig):
        def read(self, *a, **k):
            seen.append((name, where()))
            return orig(self, *a, **k)

        return read

    for name, orig in saved.items():
        setattr(torch.Tensor, name, wrap(name, orig))
    torch.cuda.synchronize = lambda *a, **k: seen.append(("synchronize", where()))
    try:
        yield seen
    finally:
        for name, orig in saved.items():
            setattr(torch.Tensor, name, orig)
        torch.cuda.synchronize = saved_sync


def steady_reads(
    method: str, rank: int, world: int, on_device: bool | str = "auto"
) -> list[tuple[str, str]]:
    """on_device: the batches from the DataLoader (auto: on CPU) or gathered from the resident
    set."""
    cfg = config.from_dict(
        {**TINY, "train": {**TINY["train"], "method": method}, "data": {"on_device": on_device}}
    )
    r = Replica(cfg, torch.device("cpu"), 64, rank, world)
    r.walk.next_timed_step()  # the epoch's first step (AGS refreshes: reads there are the start's)
    r.walk.next_timed_step()
    assert r.walk.plain_steps_ahead() >= 10, "the test needs 10 plain steps in the epoch"
    with counting_host_reads() as seen:
        for _ in range(10):
            assert r.walk.run_step(r.stream.current(r.walk.pos)) == 0
    assert r.walk.pos.step == 12
    return seen


@pytest.mark.parametrize("method", METHODS)
def test_a_steady_step_reads_nothing_from_the_device(one_process_group, method):  # noqa: F811
    assert steady_reads(method, 0, 1) == []


def test_nor_with_the_training_set_resident_on_the_device(one_process_group):  # noqa: F811
    assert steady_reads("ags", 0, 1, on_device=True) == []


def test_the_counter_sees_a_read():
    """The check can fail: a read inside is counted, with its place."""
    t = torch.ones(2)
    with counting_host_reads() as seen:
        float(t.sum()), t.tolist(), torch.cuda.synchronize()
    assert [what for what, _ in seen] == ["__float__", "tolist", "synchronize"]


def _two_ranks(rank: int, world: int, store: str, out: str) -> None:
    torch_dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world
    )
    got = {m: steady_reads(m, rank, world) for m in ("ags", "lars")}
    torch_dist.barrier()
    torch_dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as fh:
        json.dump(got, fh)


@pytest.mark.slow
def test_with_two_workers_only_the_agreement_reads_its_cpu_flags(tmp_path):
    out = str(tmp_path / "got")
    mp.spawn(_two_ranks, args=(2, str(tmp_path / "store"), out), nprocs=2, join=True)
    for rank in (0, 1):
        got = json.loads(open(f"{out}.{rank}").read())
        for method, reads in got.items():
            assert len(reads) == 10, (method, reads)  # one per step
            assert {tuple(r) for r in reads} == {
                ("tolist", "runtime/group/agreement.py:agree_host")
            }, (
                method,
                reads,
            )
