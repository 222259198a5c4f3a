"""The memory model (tula.model.memory): fit, b_max under a budget, measured out-of-memory
bounds."""

import numpy as np
import pytest

from conftest import synthetic
from tula.model import memory


def test_a_measured_oom_bounds_b_max_below_it():
    from tula.model.memory import from_points

    ok = [
        {"local_batch": 8, "peak_mem_bytes": 1000 + 100 * 8},
        {"local_batch": 32, "peak_mem_bytes": 1000 + 100 * 32},
    ]
    assert from_points(ok, [], budget_bytes=1000 + 100 * 500).max_local_batch() == 500
    # the device said no at 128 though the fit says 500 would fit: the measurement wins
    bounded = from_points(ok, [{"local_batch": 128}], budget_bytes=1000 + 100 * 500)
    assert bounded.max_local_batch() == 127 and not bounded.feasible(128) and bounded.feasible(127)
    assert from_points(ok, [{"local_batch": 128}], budget_bytes=None).max_local_batch() == 127


def test_an_oom_where_a_larger_local_batch_ran_bounds_nothing():
    import pandas as pd

    from tula.model.memory import fit, oom_bound

    rows = pd.DataFrame(
        [
            dict(workers=1, local_batch=128, status="ok", peak_mem_bytes=1000 + 100 * 128),
            dict(workers=2, local_batch=32, status="ok", peak_mem_bytes=1000 + 100 * 32),
            dict(workers=2, local_batch=64, status="oom", peak_mem_bytes=None),
        ]
    )
    # N=1 ran b=128: the N=2 OOM at b=64 is that point's, not a bound
    assert oom_bound(rows) is None
    assert fit(rows, budget_bytes=None).max_local_batch() is None
    above = pd.concat(
        [rows, pd.DataFrame([dict(workers=1, local_batch=256, status="oom", peak_mem_bytes=None)])]
    )
    assert oom_bound(above) == 256 and fit(above, budget_bytes=None).max_local_batch() == 255


def test_memory_fit_and_max_feasible_batch_by_hand():
    df = synthetic("ring", np.random.default_rng(0))
    # budget 2e6 bytes: 1e6 + 5e4 * b <= 2e6  ->  b <= 20
    mm = memory.fit(df, budget_bytes=2e6)
    assert mm.fit.intercept == pytest.approx(1e6) and mm.fit.slope == pytest.approx(5e4)
    assert mm.max_local_batch() == 20
    assert list(mm.feasible([20, 21])) == [True, False]
    assert memory.MemoryModel(mm.fit, None).max_local_batch() is None


def test_one_fallback_policy_for_the_probe_and_the_production_job():
    """After an OOM at B: the smaller batches, largest first, that split over N, at least the
    floor and one sample per worker; repeated or unsorted candidates change nothing."""
    from tula.model.memory import smaller_batches

    assert smaller_batches([32, 256, 64, 128, 64, 96], 256, 2, floor=32) == [128, 96, 64, 32]
    assert smaller_batches([8, 4, 2, 1], 16, 4, floor=1) == [8, 4]
    assert smaller_batches([128, 64], 64, 2, floor=1) == []
    assert smaller_batches([48, 64, 96], 128, 3, floor=1) == [96, 48]  # split over 3


def test_the_next_memory_point_is_the_largest_grid_batch_the_fit_says_fits():
    """Two points measured (16 and 64, 10 kB a sample over 1 MB): with a budget of 1 MB + 128
    samples the fit puts b_max at 128, so the next point is the grid's 128 (not 1,024, the
    grid's largest, nor anything at or below a batch measured); past the probe's extra points,
    or with fewer than two measured, none."""
    from tula.model.inputs import GridSpec

    g = GridSpec(workers=(1,), batch_min=16, batch_max=1024)
    pts = [{"local_batch": b, "status": "ok", "peak_mem_bytes": 1e6 + 1e4 * b} for b in (16, 64)]
    budget = 1e6 + 1e4 * 128
    assert memory.next_probe_batch(g, None, budget, pts) == 128
    assert memory.next_probe_batch(g, None, 1e6 + 1e4 * 64, pts) is None  # b_max measured
    assert memory.next_probe_batch(g, None, budget, pts[:1]) is None
    more = pts + [{"local_batch": b, "status": "ok", "peak_mem_bytes": 1.0} for b in (2, 4, 8)]
    assert memory.next_probe_batch(g, None, budget, more) is None


def test_the_memory_probe_measures_the_smallest_local_batch_x4_and_x16_capped():
    from tula.model.inputs import GridSpec

    assert memory.probe_batches(GridSpec(workers=(1,), batch_min=16, batch_max=1024)) == [
        16,
        64,
        256,
    ]
    # local batches: B / N, the smallest at the most workers, the largest at the fewest
    assert memory.probe_batches(GridSpec(workers=(2, 4), batch_min=64, batch_max=512)) == [
        16,
        64,
        256,
    ]
    assert memory.probe_batches(GridSpec(workers=(1,), batch_min=16, batch_max=128)) == [
        16,
        64,
        128,
    ]
    assert memory.probe_batches(GridSpec(workers=(1,), batch_min=16, batch_max=32)) == [16, 32]
    assert memory.probe_batches(GridSpec((1,), 16, 1024), memory_batches=(8, 2, 8)) == [2, 8]


def test_memory_that_does_not_grow_with_the_batch_fits_every_batch_or_none():
    """A flat memory fit: under the budget every local batch fits (unbounded), over it none
    (b_max 0, not a negative batch)."""
    from tula.model.linfit import fit_linear

    flat = fit_linear([1, 2], [10.0, 10.0])
    assert memory.MemoryModel(flat, 20.0).max_local_batch() is None
    assert memory.MemoryModel(flat, 5.0).max_local_batch() == 0


def test_a_job_that_failed_otherwise_ran_no_local_batch():
    """An error (not out of memory) at b = 256 says nothing of memory: the OOM at 128 above
    the 32 that ran still bounds b_max."""
    import pandas as pd

    from tula.model.memory import oom_bound

    rows = pd.DataFrame(
        [
            dict(workers=1, local_batch=32, status="ok", peak_mem_bytes=1000 + 100 * 32),
            dict(workers=1, local_batch=128, status="oom", peak_mem_bytes=None),
            dict(workers=1, local_batch=256, status="error", peak_mem_bytes=None),
        ]
    )
    assert oom_bound(rows) == 128
    assert oom_bound(rows[rows["status"] != "oom"]) is None  # the error alone bounds nothing


def test_an_oom_at_a_local_batch_that_ran_elsewhere_bounds_nothing():
    """N = 1 ran b = 64; N = 2 ran out of memory at b = 64 (DDP's buckets on top): that point
    is out, b = 64 is not."""
    import pandas as pd

    from tula.model.memory import oom_bound

    rows = pd.DataFrame(
        [
            dict(workers=1, local_batch=64, status="ok", peak_mem_bytes=1000 + 100 * 64),
            dict(workers=2, local_batch=64, status="oom", peak_mem_bytes=None),
        ]
    )
    assert oom_bound(rows) is None


def test_only_the_rows_that_ran_are_fitted():
    """A probe that timed out (or failed) after its memory peak was read: the peak is of a run
    that did not finish, and the fit leaves it out."""
    import pandas as pd

    rows = pd.DataFrame(
        [
            dict(workers=1, local_batch=b, status="ok", peak_mem_bytes=1000 + 100 * b)
            for b in (8, 32)
        ]
        + [
            dict(workers=1, local_batch=16, status=s, peak_mem_bytes=1e12)
            for s in ("timeout", "error")
        ]
    )
    got = memory.fit(rows, budget_bytes=None).fit
    assert (got.intercept, got.slope) == pytest.approx((1000, 100))


def test_no_batch_is_predicted_to_take_negative_memory():
    """A fit whose line crosses zero above b = 0 predicts 0 bytes below the crossing."""
    from tula.model.linfit import fit_linear

    mm = memory.MemoryModel(fit_linear([10, 20], [100.0, 300.0]), None)
    assert mm.predict_bytes(np.array([1.0, 20.0])).tolist() == [0.0, 300.0]


def test_a_budget_short_of_a_whole_batch_by_rounding_fits_it_and_by_more_does_not():
    """b_max rounds down the budget's batch, forgiving the float rounding of the division
    (a billionth of the batch, at least of one sample): a budget 1e-4 samples short of
    1,000,000 fits them; one 1.5e-9 samples short of one sample does not fit it."""
    from tula.model.linfit import fit_linear

    line = fit_linear([1, 2], [1.0, 2.0])  # one byte a sample
    assert memory.MemoryModel(line, 1e6 - 1e-4).max_local_batch() == 1_000_000
    assert memory.MemoryModel(line, 1 - 1.5e-9).max_local_batch() == 0


def test_a_budget_below_what_the_model_alone_takes_fits_no_batch():
    """1 MB a sample on top of 1 GB, and a budget of 0.5 GB: not even one sample fits, b_max
    is 0 (never a negative batch)."""
    from tula.model.linfit import fit_linear

    mm = memory.MemoryModel(fit_linear([1, 2], [1e9 + 1e6, 1e9 + 2e6]), 0.5e9)
    assert mm.max_local_batch() == 0 and not mm.feasible(1)


def test_the_memory_probes_batches_are_whole_samples_a_worker():
    """Three workers and B from 50 to 100: the local batches run from 50 // 3 = 16 to
    100 // 3 = 33 samples, never a fraction of one; at B = 4 over 4 workers, from 1."""
    from tula.model.inputs import GridSpec

    got = memory.probe_batches(GridSpec(workers=(3,), batch_min=50, batch_max=100))
    assert got == [16, 33] and all(isinstance(b, int) for b in got)
    assert memory.probe_batches(GridSpec(workers=(4,), batch_min=4, batch_max=256)) == [1, 4, 16]


def test_a_point_that_failed_otherwise_is_not_a_memory_measurement():
    """Next to the two points measured (16 and 64), one that failed for another reason at 256
    (no peak memory) changes nothing: the next point is still the grid's 128, which no point
    has measured."""
    from tula.model.inputs import GridSpec

    g = GridSpec(workers=(1,), batch_min=16, batch_max=1024)
    pts = [{"local_batch": b, "status": "ok", "peak_mem_bytes": 1e6 + 1e4 * b} for b in (16, 64)]
    failed = {"local_batch": 256, "status": "error", "peak_mem_bytes": None}
    assert memory.next_probe_batch(g, None, 1e6 + 1e4 * 128, [*pts, failed]) == 128


def test_the_memory_probe_stops_after_its_extra_points_however_many_it_took():
    """The grid's three first batches and two extra points: with five points measured (or six,
    after a retry) the probe is done, though the fit still says a larger batch would fit."""
    from tula.model.inputs import GridSpec

    g = GridSpec(workers=(1,), batch_min=16, batch_max=1024)
    line = [
        {"local_batch": b, "status": "ok", "peak_mem_bytes": 1e6 + 1e4 * b} for b in range(1, 7)
    ]
    budget = 1e6 + 1e4 * 128
    assert memory.next_probe_batch(g, None, budget, line[:4]) == 128
    assert memory.next_probe_batch(g, None, budget, line[:5]) is None
    assert memory.next_probe_batch(g, None, budget, line) is None


def test_b_max_is_the_smaller_of_what_the_budget_and_a_measured_oom_allow():
    """The budget allows 100 samples and an OOM was measured at 128: b_max is 100. Memory that
    does not grow with the batch, under the budget, is bounded by the OOM alone."""
    from tula.model.linfit import fit_linear
    from tula.model.memory import from_points

    ok = [{"local_batch": b, "status": "ok", "peak_mem_bytes": 1000 + 100 * b} for b in (8, 32)]
    assert from_points(ok, [{"local_batch": 128}], 1000 + 100 * 100).max_local_batch() == 100
    flat = memory.MemoryModel(fit_linear([1, 2], [10.0, 10.0]), 20.0, oom_local_batch=64)
    assert flat.max_local_batch() == 63


def test_the_next_memory_point_is_a_grid_batch_below_b_max_and_beyond_every_measured_one():
    """A budget of 200 samples puts b_max between the grid's 128 and 256: the next point is 128.
    Measured already beyond the grid's largest local batch (a probe.memory_batches of 2,000),
    nothing is left to measure."""
    from tula.model.inputs import GridSpec

    g = GridSpec(workers=(1,), batch_min=16, batch_max=1024)
    on_line = [
        {"local_batch": b, "status": "ok", "peak_mem_bytes": 1e6 + 1e4 * b} for b in (16, 64, 2000)
    ]
    assert memory.next_probe_batch(g, None, 1e6 + 1e4 * 200, on_line[:2]) == 128
    assert memory.next_probe_batch(g, (16, 64, 2000), 1e6 + 1e4 * 3000, on_line) is None


def test_b_max_is_read_from_the_memory_probes_record_and_a_wrong_file_is_named(tmp_path):
    from tula.io import write_json

    for b in (96, None):
        write_json(tmp_path / "memory_probe.json", {"max_local_batch": b, "points": []})
        assert memory.max_local_batch(tmp_path / "memory_probe.json") == b
    write_json(tmp_path / "selection.json", {"workers": 2})
    with pytest.raises(
        ValueError, match=r"selection.json: not a memory probe record.*tula memprobe"
    ):
        memory.max_local_batch(tmp_path / "selection.json")


def test_a_memory_model_reads_back_from_its_record():
    from tula.model.linfit import fit_linear

    mm = memory.MemoryModel(fit_linear([8, 32], [1800.0, 4200.0]), 1e4, oom_local_batch=64)
    back = memory.MemoryModel.from_dict(mm.to_dict())
    assert back.max_local_batch() == mm.max_local_batch() == 63
    assert back.fit == mm.fit and (back.budget_bytes, back.oom_local_batch) == (1e4, 64)
