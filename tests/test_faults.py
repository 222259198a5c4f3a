"""Fault injection (tula.faults): one spec language for the probes and the production job,
matched by place, step, rank, batch and probe point, fired once, and refused with a clear
message when malformed."""

import pytest
import torch

from tula import faults


def test_fault_specs_parse_into_their_fields():
    fs = faults.parse(
        "oom:step=12,rank=1,batch=128; "
        "signal:step=5,sig=USR2;truncate:step=10;oom:step=3,where=eval;"
        "oom:point=N2_B64,rank=1;error:point=N4_B32;profiler:point=N2_B64"
    )
    assert [(f.kind, f.step, f.rank, f.batch, f.sig, f.where, f.point) for f in fs] == [
        ("oom", 12, 1, 128, None, "forward", None),
        ("signal", 5, None, None, "USR2", "forward", None),
        ("truncate", 10, None, None, None, "forward", None),
        ("oom", 3, None, None, None, "eval", None),
        ("oom", None, 1, None, None, "forward", "N2_B64"),
        ("error", None, None, None, None, "forward", "N4_B32"),
        ("profiler", None, None, None, None, "forward", "N2_B64"),
    ]
    assert [f.place for f in fs[4:]] == ["forward", "start", "profiler"]


def test_the_injector_fires_at_its_place_step_rank_and_batch_once():
    fs = faults.parse("oom:step=12,rank=1,batch=128;oom:step=3,where=eval")
    inj = faults.Injector(fs, rank=1)
    inj("eval", 12, 128)  # another place: nothing
    inj("forward", 12, 64)  # another batch: nothing
    inj("forward", 11, 128)  # another step: nothing
    with pytest.raises(
        torch.OutOfMemoryError,
        match=r"injected by TULA_INJECT_FAULT: out of memory in forward at "
        r"step 12 on rank 1 \(global batch 128\)",
    ):
        inj("forward", 12, 128)
    inj("forward", 12, 128)  # once per process
    with pytest.raises(torch.OutOfMemoryError, match="in eval at step 3"):
        inj("eval", 3, 32)
    assert not faults.Injector(fs[:1], rank=0)  # rank 1's fault: nothing for rank 0


def test_probe_faults_are_for_their_probe_and_production_faults_never_reach_a_probe():
    fs = faults.parse("oom:point=N2_B64,rank=1;error:point=N4_B32;profiler:point=N2_B64;oom:step=2")
    assert [f.kind for f in faults.Injector(fs, rank=1, point="N2_B64").faults] == [
        "oom",
        "profiler",
    ]
    assert [f.kind for f in faults.Injector(fs, rank=0, point="N2_B64").faults] == ["profiler"]
    assert [f.kind for f in faults.Injector(fs, rank=0, point="N4_B32").faults] == ["error"]
    # the production job's
    assert [(f.kind, f.step) for f in faults.Injector(fs, rank=0).faults] == [("oom", 2)]
    with pytest.raises(
        RuntimeError,
        match=r"injected by TULA_INJECT_FAULT: error in start at step 0 on rank 0 .*probe N4_B32",
    ):
        faults.Injector(fs, rank=0, point="N4_B32")("start", 0, 32)
    profiler = faults.Injector(fs, rank=0, point="N2_B64")
    with pytest.raises(AssertionError, match="version mismatch"):
        profiler("profiler", 5, 64)
    profiler("profiler", 6, 64)  # once
    # tries=T: the first T timelines fail
    twice = faults.Injector(faults.parse("profiler:point=P,tries=2"), rank=0, point="P")
    for step in (1, 2):
        with pytest.raises(AssertionError, match="version mismatch"):
            twice("profiler", step, 64)
    twice("profiler", 3, 64)
    with pytest.raises(ValueError, match="must be integers"):
        faults.parse("profiler:point=P,tries=all")


def test_a_crash_is_for_the_probes_first_attempts_only():
    fs = faults.parse("crash:point=N2_B64,rank=1;crash:point=N4_B32,attempts=2,where=sweep")
    assert [(f.kind, f.rank, f.attempts, f.place) for f in fs] == [
        ("crash", 1, None, "profiler"),
        ("crash", None, 2, "sweep"),
    ]
    assert faults.Injector(fs, rank=1, point="N2_B64") and not faults.Injector(
        fs, rank=0, point="N2_B64"
    )
    # the launch after the crash is clean
    assert not faults.Injector(fs, rank=1, point="N2_B64", attempt=2)
    assert faults.Injector(fs, rank=0, point="N4_B32", attempt=2) and not faults.Injector(
        fs, rank=0, point="N4_B32", attempt=3
    )


def test_a_hang_waits_at_its_phase_and_is_no_injector_fault(monkeypatch):
    fs = faults.parse("hang:point=N2_B64,rank=1,where=timed steps;hang:point=N4_B32")
    assert [(f.kind, f.rank, f.where) for f in fs] == [
        ("hang", 1, "timed steps"),
        ("hang", None, "started"),
    ]
    assert not faults.Injector(fs, rank=1, point="N2_B64")  # waits, raises nothing
    waited = []

    def sleep(s):  # the hang's wait, stopped at its first sleep
        waited.append(s)
        raise InterruptedError

    monkeypatch.setattr(faults.time, "sleep", sleep)
    faults.hang_if_due(fs, 0, "N2_B64", "timed steps")  # another rank
    faults.hang_if_due(fs, 1, "N2_B64", "memory step")  # another phase
    faults.hang_if_due(fs, 1, "N8_B32", "started")  # another probe
    assert waited == []
    with pytest.raises(InterruptedError):
        faults.hang_if_due(fs, 1, "N2_B64", "timed steps")
    with pytest.raises(InterruptedError):
        faults.hang_if_due(fs, 3, "N4_B32", "started")
    assert len(waited) == 2


@pytest.mark.parametrize(
    "bad, msg",
    [
        ("boom:step=1", "unknown fault kind 'boom'"),
        ("signal:sig=USR2", "needs step="),
        ("truncate:", "needs step="),
        ("error:rank=1", "needs point="),
        ("crash:rank=1", "needs point="),
        ("crash:point=N2_B64,attempts=x", "integers"),
        ("signal:step=1,sig=KILL", "sig= one of USR2, TERM, USR1"),
        ("oom:step=x", "integers"),
        ("oom:step=1,when=2", "bad field 'when=2'"),
        ("oom:step=1,where=loss", "where='loss'.*forward, backward, refresh, eval, checkpoint"),
        ("crash:point=N2_B64,where=eval", "where='eval'.*profiler, sweep"),
        ("hang:rank=1", "needs point="),
        ("hang:point=N2_B64,where=forward", "where='forward'.*started, process group"),
    ],
)
def test_a_malformed_spec_names_what_is_wrong(bad, msg):
    with pytest.raises(ValueError, match=f"TULA_INJECT_FAULT: .*{msg}"):
        faults.parse(bad)
