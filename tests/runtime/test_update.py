"""The step's update (tula.runtime.step.update.Update), the replica's part that owns the optimizer,
its LR schedule, the GradScaler and AGS's noise pairs: what a checkpoint holds of it comes
back whole, a checkpoint of another global batch is followed (the schedule rebuilt where the
epochs stand, the noise pairs dropped), and steps undone leave no trace."""

import pytest
import torch

from tula import config, model_inputs
from tula.runtime.step.update import Update
from tula.runtime.train import methods, recipe

# the schedules are stepped here with no training step between
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of")


def _update(batch: int, spe: int, ema: float | None = None) -> Update:
    """The paper's step decay at epoch 2 of 4, no warm-up (train.method ags's LR); ``ema``:
    train.ema_decay."""
    train = {"method": "ags", "lr_decay_epochs": [2], "ema_decay": ema}
    t = config.from_dict({"train": train}).train
    net = torch.nn.Module()
    net.w = torch.nn.Parameter(torch.ones(3))
    opt = recipe.build_optimizer(t, [net.w], t.lr, 0.0)
    plan, cpu = model_inputs.lr_plan(t), torch.device("cpu")
    return Update(opt, plan, 4, (batch, spe), False, cpu, ema=recipe.build_ema(t, net))


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
    b.load_state_dict(a.state_dict())
    assert b.sched.steps == a.sched.steps == 25 and b.lr == a.lr < a.lr_plan.peak(128)
    assert b.noise_pairs == [(2.0, 1.0)] and torch.equal(_momentum(b), _momentum(a))


def test_a_checkpoint_of_another_batch_is_followed_where_the_epochs_stand():
    """A relaunch at half the batch (twice the steps an epoch) stands 2.5 epochs in, past the
    decay at epoch 2, with the pairs measured at the old batch dropped (its schedule is built
    again at the peak, then stepped to where the epochs stand)."""
    big, small = _update(256, 10), _update(128, 20)
    _steps(big, 25)
    big.noise_pairs.append((2.0, 1.0))
    small.load_state_dict(big.state_dict(), same_batch=False)
    assert small.sched.steps == 0  # the schedule is the new batch's, not yet followed
    small.follow(256, (128, 20), epochs_done=2.5, rank=1)
    assert small.noise_pairs == [] and small.sched.steps == 50
    assert small.lr == pytest.approx(small.lr_plan.peak(128) * small.lr_plan.decay_factor)
    assert torch.equal(_momentum(small), _momentum(big))  # the momentum carries over


def test_steps_undone_leave_no_trace():
    u = _update(128, 10, ema=0.9)
    _steps(u, 15)
    lr, steps, momentum, saved = u.lr, u.sched.steps, _momentum(u), u.saved()
    ema = u.ema.module.w.detach().clone()
    _steps(u, 10)  # across the decay
    u.noise_pairs.append((2.0, 1.0))
    assert u.lr < lr and not torch.equal(_momentum(u), momentum)
    assert not torch.equal(u.ema.module.w, ema)
    u.put_back(saved)
    assert (u.lr, u.sched.steps, u.noise_pairs) == (lr, steps, [])
    assert torch.equal(_momentum(u), momentum) and torch.equal(u.ema.module.w, ema)


def test_the_ema_follows_each_step_by_its_decay_and_comes_back_from_a_checkpoint():
    """ema <- 0.9 ema + 0.1 w after every step (the first step's weights taken as they are,
    as torch's AveragedModel does), kept apart from the weights, and whole in the checkpoint."""
    u = _update(128, 10, ema=0.9)
    w = u.opt.param_groups[0]["params"][0]
    want = None
    for _ in range(5):
        _steps(u, 1)
        want = w.detach().clone() if want is None else 0.9 * want + 0.1 * w.detach()
    torch.testing.assert_close(u.ema.module.w.detach(), want)
    assert not torch.equal(u.ema.module.w, w)
    back = _update(128, 10, ema=0.9)
    back.load_state_dict(u.state_dict())
    assert torch.equal(back.ema.module.w, u.ema.module.w)


def _clipped(method: str, fp16: bool) -> tuple[Update, torch.nn.Parameter]:
    """One parameter of 10s under loss sum(w^2): the gradient 20 per element, its norm
    20·sqrt(3) ≈ 34.6, far above train.grad_clip_norm = 1; plain SGD at LR 1 (no momentum,
    no decay), so the step moves the weights by the clipped gradient itself."""
    plain = {"lr": 1.0, "momentum": 0.0, "weight_decay": 0.0, "lr_decay_epochs": []}
    train = {"method": method, "grad_clip_norm": 1.0, "warmup_epochs": 0, **plain}
    t = config.from_dict({"train": train}).train
    w = torch.nn.Parameter(torch.full((3,), 10.0))
    opt, _ = methods.build_method(method, t, [w], 128, 10)
    cpu = torch.device("cpu")
    u = Update(opt, model_inputs.lr_plan(t), 4, (128, 10), fp16, cpu, t.grad_clip_norm)
    u.clear_gradients()
    u.backward((w**2).sum())
    return u, w


@pytest.mark.parametrize("method", ["lbt", "ags"])
def test_the_gradient_is_clipped_after_the_loss_scale_is_undone(method):
    """fp16's GradScaler multiplies the loss by 65,536: clipped before the scale is undone,
    the step would move the weights by 1/65,536 of the clip; after it, by the clip itself."""
    u, w = _clipped(method, fp16=True)
    assert u.loss_scale() > 1.0  # the scaler scales (on the CPU too)
    before = w.detach().clone()
    u.unscale()
    u.apply()
    assert torch.linalg.vector_norm(before - w.detach()).item() == pytest.approx(1.0, rel=1e-5)


def test_ags_reads_the_unclipped_norm_and_its_factors_scale_the_clipped_gradient():
    """AGS's variability Δ(G) is the paper's, of the step's own gradient: the norm it keeps
    is the unclipped one (3 · 20² = 1,200); the gradient the optimizer then applies is the
    clipped one (norm 1; the first step is sensitive, so no factor scales it)."""
    u, w = _clipped("ags", fp16=False)
    u.unscale()
    u.apply()
    assert u.opt.prev_sq_norm == pytest.approx(1200.0, rel=1e-6)
    assert torch.linalg.vector_norm(w.grad).item() == pytest.approx(1.0, rel=1e-5)
