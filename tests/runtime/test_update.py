"""The step's update (tula.runtime.update.Update), the replica's part that owns the optimizer,
its LR schedule, the GradScaler and AGS's noise pairs: what a checkpoint holds of it comes
back whole, a checkpoint of another global batch is followed (the schedule rebuilt where the
epochs stand, the noise pairs dropped), and steps undone leave no trace."""

import pytest
import torch

from tula import config, model_inputs
from tula.runtime import recipe
from tula.runtime.update import Update

# the schedules are stepped here with no training step between
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of")


def _update(batch: int, spe: int) -> Update:
    """The paper's step decay at epoch 2 of 4, no warm-up (train.method ags's LR)."""
    t = config.from_dict({"train": {"method": "ags", "lr_decay_epochs": [2]}}).train
    opt = recipe.build_optimizer(t, [torch.nn.Parameter(torch.ones(3))], t.lr, 0.0)
    return Update(opt, model_inputs.lr_plan(t), 4, (batch, spe), False, torch.device("cpu"))


def _steps(u: Update, n: int) -> None:
    for _ in range(n):
        u.clear_gradients()
        u.backward((u.opt.param_groups[0]["params"][0] ** 2).sum())
        u.unscale()
        u.apply()


def _momentum(u: Update) -> torch.Tensor:
    return next(iter(u.opt.state.values()))["momentum_buffer"].clone()


def test_its_checkpoint_comes_back_whole():
    a, b = _update(128, 10), _update(128, 10)
    _steps(a, 25)  # past the decay at epoch 2 (step 20)
    a.noise_pairs.append((2.0, 1.0))
    b.load(a.state(), same_batch=True)
    assert b.sched.steps == a.sched.steps == 25 and b.lr == a.lr < a.lr_plan.peak(128)
    assert b.noise_pairs == [(2.0, 1.0)] and torch.equal(_momentum(b), _momentum(a))


def test_a_checkpoint_of_another_batch_is_followed_where_the_epochs_stand():
    """A relaunch at half the batch (twice the steps an epoch) stands 2.5 epochs in, past the
    decay at epoch 2, with the pairs measured at the old batch dropped (its schedule is built
    again at the peak, then stepped to where the epochs stand)."""
    big, small = _update(256, 10), _update(128, 20)
    _steps(big, 25)
    big.noise_pairs.append((2.0, 1.0))
    small.load(big.state(), same_batch=False)
    assert small.sched.steps == 0  # the schedule is the new batch's, not yet followed
    small.follow(256, (128, 20), epochs_done=2.5, rank=1)
    assert small.noise_pairs == [] and small.sched.steps == 50
    assert small.lr == pytest.approx(small.lr_plan.peak(128) * small.lr_plan.decay_factor)
    assert torch.equal(_momentum(small), _momentum(big))  # the momentum carries over


def test_steps_undone_leave_no_trace():
    u = _update(128, 10)
    _steps(u, 15)
    lr, steps, momentum, saved = u.lr, u.sched.steps, _momentum(u), u.saved()
    _steps(u, 10)  # across the decay
    u.noise_pairs.append((2.0, 1.0))
    assert u.lr < lr and not torch.equal(_momentum(u), momentum)
    u.put_back(saved)
    assert (u.lr, u.sched.steps, u.noise_pairs) == (lr, steps, [])
    assert torch.equal(_momentum(u), momentum)
