"""The user's way of training (tula.runtime.train.recipe): train.optimizer by name or import path
with its arguments, the LR schedule as torch's schedulers stepped per step (the paper's baselines'
warm-ups among them, as they were), the loss and metric; and AGS on an adaptive optimizer,
which scales the update the optimizer computes."""

import math

import pytest
import torch

import bounds
from tula import config, model_inputs
from tula.config import ConfigError
from tula.runtime.train import loss_metric, recipe
from tula.runtime.train.optim import TulaOptimizer

# the schedules are stepped here with no training step between
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of")


def _train(**train):
    return config.from_dict({"train": train}).train


def _lrs(train: dict, batch: int, spe: int, total: int) -> list[float]:
    """The LR of every step of a run: the one the optimizer steps with, step by step."""
    t = _train(**train)
    opt = recipe.build_optimizer(t, [torch.nn.Parameter(torch.ones(2))], t.lr, 0.0)
    sched = recipe.Schedule(opt, model_inputs.lr_plan(t), batch, spe, total)
    out = []
    for _ in range(total + 5):  # past the end: the schedule stops, the LR stays
        out.append(opt.param_groups[0]["lr"])
        sched.step()
    return out


def test_the_baselines_warm_ups_are_the_ones_they_had():
    """lrs / lars: from train.lr to k = B / base_batch times it over 5 epochs (Goyal et al.),
    exactly the line they had; polo: from 1/(warm-up steps) to 1 (at most 1/W apart from the
    old max(s/W, 1/W)); ags, lbt and static: no warm-up; the step decay at its epochs."""
    spe, total = 10, 100
    for method in ("lrs", "lars"):
        got = _lrs({"method": method, "lr": 0.1}, 1024, spe, total)
        want = [0.1 * (1 + 7 * min(1.0, s / 50)) for s in range(total)]
        assert got[:total] == pytest.approx(want, rel=1e-12)
    down = _lrs({"method": "lrs", "lr": 0.1}, 64, spe, total)  # k = 0.5: warms *down*
    assert down[:total] == pytest.approx([0.1 * (1 - 0.5 * min(1.0, s / 50)) for s in range(total)])
    polo = _lrs({"method": "polo", "lr": 1.0}, 1024, spe, total)
    old = [max(s / 50, 1 / 50) if s < 50 else 1.0 for s in range(total)]
    assert polo[0] == pytest.approx(1 / 50) and polo[50:total] == pytest.approx(old[50:])
    assert max(abs(a - b) for a, b in zip(polo, old)) <= 1 / 50
    for method in ("ags", "lbt", "static"):
        assert set(_lrs({"method": method, "lr": 0.1}, 1024, spe, total)) == {0.1}
    decayed = _lrs({"lr": 0.1, "lr_decay_epochs": [3]}, 256, spe, total)
    assert set(decayed[:30]) == {0.1} and decayed[30:total] == pytest.approx([0.01] * 70)


def test_a_warm_up_then_cosine_and_onecycle_and_past_the_end():
    """warmup_epochs: 1 then cosine to eta_min over the steps left; onecycle peaks at train.lr
    and is never stepped past its end (OneCycleLR would refuse it)."""
    spe, total = 10, 110
    got = _lrs(
        {"lr": 1.0, "schedule": "cosine", "warmup_epochs": 1, "schedule_args": {"eta_min": 0.1}},
        256,
        spe,
        total,
    )
    assert got[:11] == pytest.approx([0.1 + 0.9 * s / 10 for s in range(11)])
    mid = 10 + 50  # half-way through the cosine's 100 steps
    assert got[mid] == pytest.approx(0.1 + 0.9 * 0.5)
    assert got[total - 1] == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * 99 / 100)) / 2)
    assert got[total:] == [got[total]] * 5  # stopped at the end
    cycle = _lrs({"lr": 0.4, "schedule": "onecycle"}, 256, spe, total)
    # OneCycleLR starts at max_lr / div_factor (25) and anneals far below it
    assert max(cycle) == pytest.approx(0.4) and cycle[0] == pytest.approx(0.4 / 25)
    assert cycle[-1] < cycle[0]
    assert set(_lrs({"lr": 0.3, "schedule": "constant"}, 256, spe, 20)) == {0.3}


def make_optimizer(params, lr, **kw):
    """A user's optimizer by import path: (params, lr) and its optimizer_args."""
    return torch.optim.RMSprop(params, lr=lr, **kw)


def make_schedule(opt, total_steps, **kw):
    return torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.5, total_iters=total_steps)


def test_optimizers_by_name_in_any_case_or_import_path_with_their_arguments():
    p = [torch.nn.Parameter(torch.ones(2))]
    t = _train(optimizer="AdamW", optimizer_args={"betas": [0.9, 0.99], "eps": 1e-7})
    opt = recipe.build_optimizer(t, p, 0.01, 0.05)
    assert type(opt) is torch.optim.AdamW and recipe.scales_update(opt)
    assert opt.defaults["betas"] == (0.9, 0.99) and opt.defaults["weight_decay"] == 0.05
    sgd = recipe.build_optimizer(_train(optimizer_args={"nesterov": True}), p, 0.1, 0.0)
    assert sgd.defaults["nesterov"] and sgd.defaults["momentum"] == 0.9 and sgd.defaults["fused"]
    assert not recipe.scales_update(sgd)
    own = _train(optimizer="test_recipe:make_optimizer", optimizer_args={"alpha": 0.9})
    assert recipe.build_optimizer(own, p, 0.1, 0.0).defaults["alpha"] == 0.9
    with pytest.raises(
        ConfigError, match=r"'train.optimizer': torch.optim has no optimizer 'adamm'"
    ):
        recipe.build_optimizer(_train(optimizer="adamm"), p, 0.1, 0.0)
    bad = _train(optimizer="adamw", optimizer_args={"nesterov": True})
    with pytest.raises(
        ConfigError, match=r"'train.optimizer_args': torch.optim.AdamW takes no 'nesterov'"
    ):
        recipe.build_optimizer(bad, p, 0.1, 0.0)
    t = _train(schedule="test_recipe:make_schedule")
    opt = recipe.build_optimizer(t, p, 1.0, 0.0)
    sched = recipe.Schedule(opt, model_inputs.lr_plan(t), 64, 10, 20)
    [sched.step() for _ in range(20)]
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * t.lr)


@pytest.mark.parametrize(
    "train, says",
    [
        ({"schedule": "cosinus"}, "'train.schedule': 'cosinus' is neither 'step'"),
        ({"schedule": "cosine", "lr_decay_epochs": [3]}, "'train.lr_decay_epochs': the decay"),
        ({"method": "lars", "optimizer": "adamw"}, "'train.method': lars is the layer-wise"),
        ({"optimizer_args": {"lr": 0.1}}, "'train.optimizer_args.lr': set train.lr instead"),
        ({"loss": "mse"}, "'train.loss': 'mse' is neither 'cross_entropy'"),
        ({"metric_goal": "min"}, "'train.metric_goal': accuracy's goal is max"),
        ({"loss": "a.b:c", "label_smoothing": 0.1}, "'train.label_smoothing': it is cross-entropy"),
        ({"method": "polo", "ema_decay": 0.99}, "'train.ema_decay': post-local SGD's workers"),
        ({"ema_decay": 1.0}, "'train.ema_decay': 1.0 is greater than or equal to the maximum"),
    ],
)
def test_the_config_refuses_what_cannot_go_together(train, says):
    with pytest.raises(ConfigError, match=says.replace("(", r"\(")):
        config.from_dict({"train": train})


def test_the_loss_smooths_labels_and_the_metric_is_summed_over_the_batch():
    out, y = torch.tensor([[4.0, 0.0], [0.0, 1.0], [3.0, 0.0]]), torch.tensor([0, 1, 1])
    plain = loss_metric.build_loss(_train())(out, y)
    smooth = loss_metric.build_loss(_train(label_smoothing=0.2))(out, y)
    want = torch.nn.functional.cross_entropy(out, y, label_smoothing=0.2)
    assert (
        float(smooth) == pytest.approx(float(want)) and abs(float(smooth - plain)) > bounds.ROUNDING
    )
    assert float(loss_metric.build_metric(_train())(out, y)) == 2.0  # two of three right


def _pair(scale_update: bool):
    """Two identical nets: one with plain AdamW, one with AdamW under AGS whose factors are all
    2 and whose threshold never makes a step sensitive (the first step has no previous norm,
    so it is sensitive and unscaled)."""
    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    plain = torch.optim.AdamW(a.parameters(), lr=0.01)
    ags = TulaOptimizer(
        torch.optim.AdamW(b.parameters(), lr=0.01), delta=math.inf, scale_update=scale_update
    )
    for p in b.parameters():
        ags.factors[p] = torch.full_like(p, 2.0)
    return (a, plain), (b, ags)


def _step(net, opt, x, y):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()


def test_ags_with_adamw_scales_the_update_by_its_factors():
    """The same batches: the first step (sensitive) moves both alike; the second moves AGS's
    weights by exactly twice plain AdamW's update. Scaling AdamW's *gradient* instead would
    move them by about the same as plain AdamW: its second moment cancels the factor."""
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    moved = {}
    for scale_update in (True, False):
        (a, plain), (b, ags) = _pair(scale_update)
        for net, opt in ((a, plain), (b, ags)):
            _step(net, opt, x, y)
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
        before = [p.detach().clone() for p in a.parameters()]
        for net, opt in ((a, plain), (b, ags)):
            _step(net, opt, x, y)
        ratios = [
            ((q - w) / (p - w)).flatten() for p, q, w in zip(a.parameters(), b.parameters(), before)
        ]
        moved[scale_update] = torch.cat(ratios).detach()
        assert ags.counters["scaled"] == 1
    assert moved[True].tolist() == pytest.approx([2.0] * len(moved[True]), rel=bounds.ROUNDING)
    # the gradient scaled instead: about plain AdamW's move (0.97 of it), nowhere near twice
    median = float(moved[False].median())
    assert abs(median - 1) < abs(median - 2)


def make_named_optimizer(named_params, lr):
    """A user's optimizer that groups by name itself: decay only on weights of 2+ dims."""
    decay = [p for n, p in named_params if p.ndim > 1]
    rest = [p for n, p in named_params if p.ndim <= 1]
    opt = torch.optim.SGD([{"params": decay}, {"params": rest, "weight_decay": 0.0}], lr=lr)
    opt.names_seen = [n for n, _ in named_params]
    return opt


def exempt_the_head(named_params):
    return [n for n, _ in named_params if n.startswith("head.")] + ["no.such"]


def _net() -> torch.nn.Module:
    """Conv, batch norm, linear head: the parameter kinds no_weight_decay sorts."""
    net = torch.nn.Sequential()
    net.add_module("conv", torch.nn.Conv1d(1, 4, 3))
    net.add_module("bn", torch.nn.BatchNorm1d(4))
    net.add_module("ln", torch.nn.LayerNorm(4))
    net.add_module("head", torch.nn.Linear(4, 2))
    return net


def test_norms_and_biases_are_exempt_from_weight_decay_and_the_rest_decays():
    """One SGD step on zero gradients at LR 1 and weight decay 0.1: every decayed weight is
    multiplied by 0.9 (to float32's rounding, torch's assert_close), every exempt one is
    exactly unchanged."""
    net = _net()
    t = _train(optimizer="sgd", momentum=0.0, no_weight_decay=["norm", "bias"])
    exempt = {"conv.bias", "bn.weight", "bn.bias", "ln.weight", "ln.bias", "head.bias"}
    assert recipe.exempt_from_decay(t, net) == exempt
    opt = recipe.build_optimizer(t, net, 1.0, 0.1)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in net.named_parameters():
        if n in recipe.exempt_from_decay(t, net):
            assert torch.equal(p.detach(), before[n]), n
        else:
            torch.testing.assert_close(p.detach(), before[n] * 0.9, msg=n)
            assert not torch.equal(p.detach(), before[n]), n
    only_bias = _train(no_weight_decay=["bias"])
    assert recipe.exempt_from_decay(only_bias, net) == {n for n in exempt if n.endswith("bias")}
    flat = recipe.param_groups(_train(), net)  # none exempt: one flat list, in the model's order
    assert [id(p) for p in flat] == [id(p) for p in net.parameters()]


def test_a_callable_names_the_exempt_and_an_optimizer_may_take_names():
    net = _net()
    t = _train(no_weight_decay="test_recipe:exempt_the_head")
    with pytest.raises(
        ConfigError,
        match=r"'train.no_weight_decay': test_recipe:exempt_the_head returned .*'no.such'",
    ):
        recipe.build_optimizer(t, net, 0.1, 0.1)
    own = _train(optimizer="test_recipe:make_named_optimizer")
    opt = recipe.build_optimizer(own, net, 0.1, 0.0)
    assert opt.names_seen == [n for n, _ in net.named_parameters()]
    assert [len(g["params"]) for g in opt.param_groups] == [2, 6]
    with pytest.raises(ConfigError, match="'train.no_weight_decay': lars applies"):
        _train(method="lars", no_weight_decay=["bias"])
