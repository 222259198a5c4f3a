"""What a probe's first steps paid beyond the same steps later (tula.model.predictions'
one-off extras), by hand: the first step's extra less the short batch's first step, the short
batch's own extra, and where there is none."""

import numpy as np
import pandas as pd
import pytest

from tula.model.predictions import one_off_extras


def test_the_first_steps_extras_by_hand():
    ok = pd.DataFrame(
        {
            "global_batch": [64, 64, 1024],
            "step_time_s": [0.1, 0.1, 0.3],
            # the first step and the short batch's first step together; the whole epoch at 1,024
            "first_steps_time_s": [1.0, 0.6, 1.5],
            "first_short_step_s": [0.25, np.nan, np.nan],
            "partial_extra_s": [0.05, np.nan, np.nan],
        }
    )
    first, short = one_off_extras(ok, train_samples=1000)
    # 1.0 - 0.25 - 0.1; with no short batch of its own 0.6 - 0.1; B >= D: two steps of one shape
    assert first.tolist() == pytest.approx([0.65, 0.5, 1.5 - 2 * 0.3], rel=1e-12)
    # the short batch's first step over its own step (the step and its partial extra)
    assert short.iloc[0] == pytest.approx(0.25 - 0.15, rel=1e-12)
    assert short.iloc[1:].isna().all()


def test_an_extra_is_never_below_zero():
    ok = pd.DataFrame(
        {
            "global_batch": [64],
            "step_time_s": [0.5],
            "first_steps_time_s": [0.4],
            "first_short_step_s": [0.1],
        }
    )
    first, short = one_off_extras(ok, train_samples=None)
    assert first.tolist() == [0.0] and short.tolist() == [0.0]
