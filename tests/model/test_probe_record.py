"""The probe record (tula.model.probe_record), typed: read back whole from the flat JSON the user
reads, the launcher's notes on it (lost ranks, a retry, fallbacks, its wall and settings), and
a file that is not a probe record refused with what is wrong."""

import pytest

from tula.model.probe_measured import Measurement
from tula.model.probe_record import Failure, Probed, ProbeRecord, RankResult

POINT = Probed(workers=2, global_batch=64, local_batch=32, nodes=1, model="m", dataset="d")


def _ok(sweep_rows=2):
    rows = [{"local_batch": 16, "compute_time_s": 0.01}] * sweep_rows
    result = RankResult(0).measured_as(Measurement(step_time_s=0.1, compute_time_s=0.08))
    result = result.swept(rows, "N2_B64").noted("noise", "too few steps")
    return ProbeRecord(POINT, "ok", result=result)


def test_a_record_with_every_note_reads_back_whole():
    small = ProbeRecord(Probed(2, 32, 16), "ok", result=RankResult(0, Measurement(0.05)))
    rec = (
        _ok()
        .with_launch("2026-12-06T03:00:00Z")
        .with_wall(12.5)
        .with_retry("rank 1 lost", [1])
        .with_fallbacks([small])
        .with_settings("abc123")
    )
    flat = rec.to_json()
    assert flat["schema"] == "tula.probe/1" and "accumulate" not in flat  # one batch a step
    assert flat["noise_error"] == "too few steps" and flat["sweep_in"] == "N2_B64"
    assert flat["retried_after"] == {"error": "rank 1 lost", "lost_ranks": [1]}
    assert flat["fallbacks"][0]["global_batch"] == 32 and flat["wall_s"] == 12.5
    back = ProbeRecord.from_json(flat)
    assert back.to_json() == flat
    import json  # as the file gives it back: its strings new objects, not the code's literals

    assert ProbeRecord.from_json(json.loads(json.dumps(flat))).to_json() == flat
    assert back.measured.step_time_s == 0.1 and len(back.sweep) == 2 and back.ok
    k = ProbeRecord(Probed(2, 64, 32, accumulate=4), "ok", result=RankResult(0)).to_json()
    assert k["accumulate"] == 4


def test_a_failed_record_holds_its_failure_and_no_measurement():
    rec = ProbeRecord(POINT, "oom", error="CUDA out of memory", traceback="Traceback ...")
    flat = rec.to_json()
    assert (flat["status"], flat["error"], flat["traceback"]) == (
        "oom",
        "CUDA out of memory",
        "Traceback ...",
    )
    back = ProbeRecord.from_json(flat)
    assert not back.ok and back.result is None and back.measured == Measurement()
    assert back.sweep == [] and back.sweep_in is None
    # a point that failed after rank 0 measured holds its failure alone, not half a measurement
    half = ProbeRecord(POINT, "error", error="x", result=RankResult(0, Measurement(0.1)))
    assert "step_time_s" not in half.to_json()


def test_ranks_lost_are_said_where_they_matter():
    died = "rank(s) [1] died without writing a result"
    err = ProbeRecord(POINT, "error", error="Connection reset by peer").with_lost([1])
    assert err.lost_ranks == [1] and err.error.startswith(died)
    assert err.error.endswith("; Connection reset by peer")  # the peers' error is not the cause
    ok = _ok(sweep_rows=3).with_lost([1])
    assert ok.error is None and ok.after_error.startswith(died)
    assert "after the measurement stood" in ok.after_error and "(3 sweep rows)" in ok.after_error
    # the note goes to the JSON as it was said, and reads back the same
    assert ok.to_json()["after_error"] == ok.after_error
    assert ProbeRecord.from_json(ok.to_json()).after_error == ok.after_error
    timeout = ProbeRecord(POINT, "timeout")
    assert timeout.with_lost([1]) is timeout  # a timeout's record says it already


def test_a_file_that_is_not_a_probe_record_is_refused_naming_what():
    with pytest.raises(ValueError, match="missing global_batch, status"):
        ProbeRecord.from_json({"workers": 2})
    with pytest.raises(ValueError, match="not a probe record's key\\(s\\): colour, size"):
        ProbeRecord.from_json(
            {"workers": 2, "global_batch": 64, "status": "ok", "size": 1, "colour": 2}
        )


def test_a_rank_result_keeps_its_failure_and_its_notes():
    failed = RankResult(1).failed_with(Failure("oom", "out of memory", failed_at=5.0))
    assert failed.failed and failed.to_json() == {
        "rank": 1,
        "status": "oom",
        "error": "out of memory",
        "failed_at": 5.0,
    }
    assert RankResult.from_json(failed.to_json()) == failed
    noted = RankResult(0).with_overheads(None, "eval crashed").timed(3.0)
    assert noted.failed_after_measurement and noted.phase_errors == {"overheads": "eval crashed"}
    assert RankResult(0).timed(3.0).failed_after_measurement is False  # a flag, not a method
    assert RankResult.from_json(noted.to_json()).point_wall_s == 3.0
    with pytest.raises(ValueError, match="'warmup' is not one of"):
        RankResult(0).noted("warmup", "x")
