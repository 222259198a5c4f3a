"""The input floor's forms (tula.model.floor): their starting points and which forms a fit
judges (their bounds: tests/model/test_forms.py)."""

import numpy as np
import pandas as pd
import pytest

from tula.model import floor

B = np.array([8.0, 32.0, 128.0])


def test_the_floors_starts_are_the_least_squares_line_and_the_rate_through_zero():
    """Several local batches: the first start of the linear form is the least-squares line
    (intercept and slope as measured, floored at the bounds), the second the mean time a
    sample through the origin; the per-sample form starts at that rate; the shared form tries
    each linear start unshared (k = 0) and shared (k = 0.5)."""
    X = {"b": B, "n": np.ones_like(B)}
    y = 0.002 + 1e-4 * B
    rate = float(np.mean(y / B))
    by = floor.INPUT_FORMS
    line, through_zero = by["linear"].starts(X, y)
    assert line == pytest.approx([0.002, 1e-4], rel=1e-9)
    assert through_zero.tolist() == [0.0, rate]
    assert [s.tolist() for s in by["per_sample"].starts(X, y)] == [[rate]]
    shared = by["linear_shared"].starts(X, y)
    assert [s[-1] for s in shared] == [0.0, 0.5, 0.0, 0.5]
    assert [s[:2].tolist() for s in shared] == [line.tolist()] * 2 + [through_zero.tolist()] * 2


def test_input_timed_at_one_local_batch_starts_from_its_rate_alone():
    """One local batch: a line through one point is anyone's guess, so the linear form starts
    only from the rate through the origin."""
    X = {"b": np.full(3, 32.0), "n": np.ones(3)}
    y = np.array([0.004, 0.005, 0.006])
    starts = floor.INPUT_FORMS["linear"].starts(X, y)
    assert [s.tolist() for s in starts] == [[0.0, float(np.mean(y / 32.0))]]


def test_input_from_one_worker_a_node_is_not_offered_the_shared_form():
    """Every probe had one worker on its node: nothing measures how the node's workers share
    its loaders, so the shared form is not judged."""
    rows = pd.DataFrame(
        [dict(workers=n, local_batch=b, input_time_s=1e-4 * b) for n in (1, 2) for b in B]
    )
    one = floor.fit_input(rows, workers_per_node=1)
    assert {c["form"] for c in one.extra["candidates"]} == {"per_sample", "linear"}
    two = floor.fit_input(rows, workers_per_node=2)
    assert "linear_shared" in {c["form"] for c in two.extra["candidates"]}
