"""The learning rate a method trains with at a global batch (tula.model.lrplan): the linear
scaling rule of lrs and lars (k = B / base_batch), the plain LR of every other method, and the
step schedule's defaults (a tenth at each decay epoch)."""

import dataclasses

import pytest

from tula.model.lrplan import LINEAR_SCALING, LRPlan


def test_linear_scaling_multiplies_the_lr_by_the_batch_over_the_base_batch():
    plan = LRPlan(lr=0.1, linear_scaling=True, base_batch=256, warmup_epochs=5.0)
    assert plan.k(1024) == 4 and plan.k(128) == 0.5
    assert plan.peak(1024) == pytest.approx(0.4, rel=1e-12)
    assert plan.peak(256) == pytest.approx(0.1, rel=1e-12)


def test_without_linear_scaling_every_batch_trains_at_the_lr_itself():
    plan = LRPlan(lr=0.05, linear_scaling=False, base_batch=256, warmup_epochs=0.0)
    assert [plan.k(b) for b in (32, 256, 4096)] == [1.0, 1.0, 1.0]
    assert plan.peak(4096) == 0.05


def test_the_step_schedule_decays_by_a_tenth_unless_told_and_the_plan_is_frozen():
    plan = LRPlan(lr=0.1, linear_scaling=True, base_batch=256, warmup_epochs=5.0)
    assert (plan.schedule, plan.schedule_args, plan.decay_epochs) == ("step", {}, ())
    assert plan.decay_factor == pytest.approx(0.1, rel=1e-12)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.lr = 1.0  # the replica keeps it: no one changes it under a running schedule
    assert set(LINEAR_SCALING) == {"lrs", "lars"}
