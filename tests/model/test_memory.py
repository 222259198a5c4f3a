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


def test_a_budget_below_what_the_model_alone_takes_fits_no_batch():
    """1 MB a sample on top of 1 GB, and a budget of 0.5 GB: not even one sample fits, b_max
    is 0 (never a negative batch)."""
    from tula.model.linfit import fit_linear

    mm = memory.MemoryModel(fit_linear([1, 2], [1e9 + 1e6, 1e9 + 2e6]), 0.5e9)
    assert mm.max_local_batch() == 0 and not mm.feasible(1)
