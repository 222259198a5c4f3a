"""The probe's worker (tula.runtime.probe_worker): how rank 0 turns every rank's timed steps
into the probe's step, compute and sync times, and what a failure leaves in the record. (The
worker runs end to end under torchrun in tests/stages/test_probe.py.)"""

import pytest
import torch
from test_replica import _replica, one_process_group  # noqa: F401 - the fixture, and a real replica in it

from tula.runtime import probe_worker


def test_the_slowest_rank_per_step_and_an_epoch_starts_extra_at_trainings_rate(one_process_group):  # noqa: F811
    replica = _replica("fp32")  # digits at B=64: 23 steps an epoch
    gathered = [
        {
            "step": [0.10, 0.12, 0.30],
            "compute": [0.08, 0.09],
            "peak": 100,
            "peaks": {"plain": 90, "refresh": 100},
            "rss": 5,
            "host": "a",
        },
        {
            "step": [0.11, 0.10, 0.32],
            "compute": [0.07, 0.10],
            "peak": 120,
            "peaks": {"plain": 120, "refresh": 110},
            "rss": 7,
            "host": "b",
        },
    ]
    synced = [
        (0.10, "plain"),
        (0.12, "plain"),
        (0.30, "start"),
    ]  # this rank's times and the kinds of its steps
    compute = [(0.08, "plain"), (0.09, "plain")]
    m = probe_worker._measurement(replica, gathered, synced, compute)
    plain, start_extra = (0.11 + 0.12) / 2, 0.32 - (0.11 + 0.12) / 2  # per step the slower rank
    assert m["step_times_s"] == [0.11, 0.12] and m["compute_times_s"] == [0.08, 0.10]
    assert m["epoch_start_step_times_s"] == [0.32] and m["epoch_start_extra_s"] == pytest.approx(
        start_extra
    )
    assert m["step_time_s"] == pytest.approx(plain + start_extra / 23)
    assert m["compute_time_s"] == pytest.approx(0.09 + start_extra / 23)
    assert m["sync_time_s"] == pytest.approx(plain - 0.09) and m["steps_per_epoch"] == 23
    assert (
        m["peak_mem_bytes"],
        m["plain_peak_bytes"],
        m["refresh_peak_bytes"],
        m["rss_peak_bytes"],
    ) == (120, 120, 110, 7)


def test_a_failure_before_the_measurement_is_the_record_and_after_it_a_note_beside_it():
    measured = {"rank": 0, "status": "ok", "step_time_s": 0.1}
    oom = probe_worker._failure({}, torch.OutOfMemoryError("CUDA out of memory\nmore"), 1, after="")
    assert oom == {
        "rank": 1,
        "status": "oom",
        "error": "out of memory on rank 1: CUDA out of memory",
    }
    err = probe_worker._failure({}, RuntimeError("boom"), 0, after="")
    assert (err["status"], err["error"]) == (
        "error",
        "rank 0: RuntimeError: boom",
    ) and "traceback" in err
    kept = probe_worker._failure(measured, RuntimeError("lost peer"), 0, after="sweep")
    assert kept == {**measured, "sweep_error": "rank 0: RuntimeError: lost peer"}
