import copy
import math

import pytest
import torch

from tula.runtime.train.optim import (
    TulaOptimizer,
    ags_scales,
    grad_variability,
    squared_global_norm,
)
from tula.runtime.train.refresh import refresh_scales


def test_squared_global_norm_and_eq5_by_hand():
    g = [torch.tensor([3.0, 4.0]), torch.tensor([[12.0]])]
    assert float(squared_global_norm(g)) == pytest.approx(9 + 16 + 144)
    assert grad_variability(150.0, 100.0) == pytest.approx(0.5)
    assert grad_variability(60.0, 100.0) == pytest.approx(0.4)
    assert grad_variability(1.0, None) == math.inf  # first step: nothing to compare, sensitive


def test_ags_scale_formula_and_clamps():
    gs = [torch.tensor([1.0, -4.0, 0.0, 5.0])]
    gl = [torch.tensor([2.0, 1.0, 3.0, 0.0])]
    (s,) = ags_scales(gs, gl, s_max=3.0, s_min=0.1, eps=1e-8)
    # |1/2| = 0.5; |-4/1| = 4 -> s_max 3; |0/3| = 0 -> s_min 0.1; |5/(0+eps)| huge -> 3
    assert torch.allclose(s, torch.tensor([0.5, 3.0, 0.1, 3.0]))
    (s0,) = ags_scales([torch.tensor([float("nan")])], [torch.tensor([1.0])], s_max=2.0)
    assert s0.item() == 1.0  # a non-finite scale is replaced by 1


def linear_problem():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1, bias=False)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    return model, x, y, torch.nn.MSELoss()


def test_ags_step_matches_algorithm_1_by_hand():
    model, x, y, loss_fn = linear_problem()
    w0 = model.weight.detach().clone()
    opt = TulaOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), mode="ags", delta=0.5, s_max=2.0, eps=1e-8
    )

    # hand computation of the gradients of the large batch (8) and of a sub-batch (first 2)
    def grad(xb, yb, w):
        return (2.0 / len(xb)) * ((xb @ w.T - yb).T @ xb)

    g_large, g_small = grad(x, y, w0), grad(x[:2], y[:2], w0)
    loss_fn(model(x), y).backward()
    refresh_scales(model, opt, loss_fn, x[:2], y[:2])
    assert torch.allclose(model.weight.grad, g_large, atol=1e-6)  # the large gradient is restored
    expected_s = (g_small / (g_large + 1e-8)).abs().clamp(max=2.0)
    assert torch.allclose(opt.scales()[0], expected_s, atol=1e-5)
    opt.prev_sq_norm = float((g_large**2).sum())  # Delta = 0 < 0.5: not sensitive -> scaled
    opt.step()
    assert torch.allclose(model.weight.detach(), w0 - 0.1 * expected_s * g_large, atol=1e-6)
    assert opt.counters["scaled"] == 1


def test_sensitive_phase_leaves_gradient_unscaled():
    model, x, y, loss_fn = linear_problem()
    w0 = model.weight.detach().clone()
    opt = TulaOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), mode="static", static_scale=4.0, delta=0.5
    )
    loss_fn(model(x), y).backward()
    g = model.weight.grad.clone()
    opt.prev_sq_norm = float((g**2).sum()) / 10  # Delta = 9 >= 0.5: sensitive
    opt.step()
    assert torch.allclose(model.weight.detach(), w0 - 0.1 * g)
    assert opt.counters == {**opt.counters, "sensitive": 1, "scaled": 0}


def test_static_scaling_applies_s_outside_sensitive_phases():
    model, x, y, loss_fn = linear_problem()
    w0 = model.weight.detach().clone()
    opt = TulaOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), mode="static", static_scale=4.0, delta=0.5
    )
    loss_fn(model(x), y).backward()
    g = model.weight.grad.clone()
    opt.prev_sq_norm = float((g**2).sum())
    opt.step()
    assert torch.allclose(model.weight.detach(), w0 - 0.1 * 4.0 * g)


def test_nonfinite_gradient_never_reaches_the_weights():
    model, x, y, loss_fn = linear_problem()
    w0 = model.weight.detach().clone()
    opt = TulaOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model.weight.grad = torch.tensor([[1.0, float("inf"), 0.0]])
    opt.step()
    assert torch.equal(model.weight.detach(), w0) and opt.counters["skipped_nonfinite"] == 1


def train_steps(model, opt, data, k, refresh_at=(0,)):
    loss_fn = torch.nn.MSELoss()
    for i, (x, y) in enumerate(data[:k]):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        if i in refresh_at:
            refresh_scales(model, opt, loss_fn, x[:4], y[:4])
        opt.step()


def test_state_dict_round_trip_resumes_bit_identically():
    torch.manual_seed(1)
    data = [(torch.randn(16, 5), torch.randn(16, 1)) for _ in range(12)]

    def make():
        torch.manual_seed(2)
        m = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        return m, TulaOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), mode="ags", s_max=2.0, delta=2.0
        )

    m1, o1 = make()
    train_steps(m1, o1, data, 12, refresh_at=(0, 6))
    m2, o2 = make()
    train_steps(m2, o2, data, 6, refresh_at=(0,))
    ckpt = copy.deepcopy({"model": m2.state_dict(), "opt": o2.state_dict()})
    m3, o3 = make()
    m3.load_state_dict(ckpt["model"])
    o3.load_state_dict(ckpt["opt"])
    train_steps(m3, o3, data[6:], 6, refresh_at=(0,))
    assert o3.counters["steps"] == 12 and o3.counters["scaled"] > 0
    for a, b in zip(m1.parameters(), m3.parameters()):
        assert torch.equal(a, b)


def test_works_with_lr_schedulers():
    m = torch.nn.Linear(2, 1)
    opt = TulaOptimizer(torch.optim.SGD(m.parameters(), lr=1.0))
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[1], gamma=0.1)
    m(torch.ones(1, 2)).sum().backward()
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1) and opt.optim.param_groups[0][
        "lr"
    ] == pytest.approx(0.1)


def _ddp_worker(rank: int, world: int, store_path: str, out_path: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    ddp = DDP(model)
    opt = TulaOptimizer(
        torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9), mode="ags", s_max=2.0, delta=10.0
    )
    gen = torch.Generator().manual_seed(100 + rank)  # every rank sees different data
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(6):
        x, y = torch.randn(32, 6, generator=gen), torch.randint(0, 3, (32,), generator=gen)
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        if step in (0, 3):
            refresh_scales(ddp, opt, loss_fn, x[:4], y[:4])  # rank-local slice of the sub-batch
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    scales = torch.cat([s.reshape(-1) for s in opt.scales()])
    all_scales = [torch.empty_like(scales) for _ in range(world)]
    dist.all_gather(all_scales, scales)
    if rank == 0:
        torch.save({"params": gathered, "scales": all_scales, "counters": opt.counters}, out_path)
    # both ranks leave together, as tula.runtime.group.dist.finish does: a rank that tore its gloo
    # group down while the other still saved was once aborted (SIGABRT, "terminate called
    # without an active exception", CI 2026-11-27)
    dist.barrier()
    dist.destroy_process_group()


def test_ddp_replicas_stay_bit_identical_with_ags(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "out.pt"
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    r = torch.load(out)
    assert r["counters"]["scaled"] > 0 and r["counters"]["refreshes"] == 2
    assert torch.equal(r["scales"][0], r["scales"][1])  # identical scales on both ranks
    assert torch.equal(r["params"][0], r["params"][1])  # hence bit-identical replicas


def test_lars_trust_ratio_by_hand():
    from tula.runtime.train.methods import LARS

    w = torch.nn.Parameter(torch.tensor([[3.0, 4.0]]))  # ||w|| = 5
    b = torch.nn.Parameter(torch.tensor([1.0]))  # 1-D: excluded from the trust ratio
    opt = LARS(torch.optim.SGD([w, b], lr=1.0, weight_decay=0.0), weight_decay=0.1, eta=0.001)
    w.grad, b.grad = torch.tensor([[0.0, 2.0]]), torch.tensor([0.5])  # ||g|| = 2
    opt.step()
    trust = 0.001 * 5 / (2 + 0.1 * 5)
    g_w = (torch.tensor([[0.0, 2.0]]) + 0.1 * torch.tensor([[3.0, 4.0]])) * trust
    assert torch.allclose(w.detach(), torch.tensor([[3.0, 4.0]]) - g_w)
    assert torch.allclose(b.detach(), torch.tensor([1.0 - (0.5 + 0.1 * 1.0)]))


@pytest.fixture
def one_process_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def test_build_method_uses_torch_post_local_sgd_and_ags_smax(one_process_group):
    from torch.distributed.optim import PostLocalSGDOptimizer

    from tula import config
    from tula.runtime.train.methods import build_method

    t = config.from_dict({"train": {"method": "polo"}}).train
    opt, _ = build_method("polo", t, [torch.nn.Parameter(torch.zeros(2))], 512, steps_per_epoch=20)
    assert isinstance(opt, PostLocalSGDOptimizer)
    # 4 averages/epoch after 5 epochs
    assert opt.averager.period == 5 and opt.averager.warmup_steps == 5 * 20
    opt, _ = build_method("ags", t, [torch.nn.Parameter(torch.zeros(2))], 512, steps_per_epoch=20)
    assert isinstance(opt, TulaOptimizer) and opt.s_max == pytest.approx(4.0)  # sqrt(512 / 32)


def _two_layer():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))


def test_ags_factors_are_per_parameter_state_and_follow_their_parameter():
    """Each factor is AGS's own, keyed by its parameter (opt.factors), and saved by parameter
    index in AGS's state_dict, never in the wrapped optimizer's state; a parameter that had no
    gradient when the factors were measured is left unscaled later, and counted, while the
    others are scaled."""
    net = _two_layer()
    first, second = list(net[0].parameters()), list(net[1].parameters())
    opt = TulaOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), mode="ags", delta=0.5, s_max=4.0
    )
    x, y, loss_fn = torch.randn(8, 3), torch.randn(8, 1), torch.nn.MSELoss()
    loss_fn(net(x), y).backward()
    for p in first:
        p.grad = None  # the first layer has no gradient at this refresh
    refresh_scales(net, opt, loss_fn, x[:2], y[:2])
    assert [(p in opt.factors) for p in net.parameters()] == [False, False, True, True]
    assert all(opt.factors[p].shape == p.shape for p in second)
    opt.zero_grad()
    loss_fn(net(x), y).backward()
    g = {p: p.grad.clone() for p in net.parameters()}
    opt.prev_sq_norm = float(squared_global_norm(list(g.values())))  # Delta = 0: scaled
    before = [p.detach().clone() for p in net.parameters()]
    opt.step()
    for p, w0 in zip(net.parameters(), before):
        s = opt.factors.get(p, torch.ones_like(p))
        # momentum buffer starts at the step
        assert torch.allclose(p.detach(), w0 - 0.1 * s * g[p], atol=1e-6)
    assert opt.counters["scaled"] == 1 and opt.counters["unscaled_params"] == 2
    # the factors travel in AGS's state_dict, by parameter index
    fresh = TulaOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), mode="ags", s_max=4.0
    )
    fresh.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert all(torch.equal(fresh.factors[p], opt.factors[p]) for p in second)
    assert not any("ags_scale" in st for st in opt.state_dict()["base"]["state"].values())
    assert fresh.counters == opt.counters and fresh.prev_sq_norm == opt.prev_sq_norm
    opt.forget_scales()
    assert opt.scales() == [] and "momentum_buffer" in opt.state[second[0]]


def test_lars_evaluates_the_closure_once_before_scaling():
    """torch.optim's convention: step(closure) evaluates the closure (which recomputes the
    gradients) first; LARS then scales those gradients. Evaluated after the scaling, as
    before, the closure would put the unscaled gradients back."""
    from tula.runtime.train.methods import LARS

    def setup():
        torch.manual_seed(2)
        net = torch.nn.Linear(3, 2)
        return net, LARS(
            torch.optim.SGD(net.parameters(), lr=0.5), weight_decay=0.01, eta=0.02, exclude_1d=False
        )

    x, y = torch.randn(6, 3), torch.randn(6, 2)
    plain, plain_opt = setup()
    torch.nn.functional.mse_loss(plain(x), y).backward()
    plain_opt.step()  # gradients computed beforehand, no closure
    net, opt = setup()
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert len(calls) == 1 and float(loss.detach()) > 0
    # scaled exactly as without
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), plain.parameters()))


@pytest.mark.filterwarnings("ignore:Detected call of")
@pytest.mark.parametrize("method", ["ags", "lars", "polo"])
def test_an_lr_schedule_reaches_the_wrapped_optimizer_after_a_resume(one_process_group, method):
    """torch's Optimizer.load_state_dict builds new param_groups; a wrapper sharing the old ones
    (TulaOptimizer, LARS, torch's PostLocalSGDOptimizer) would leave a resumed warm-up or decay
    stuck at the checkpoint's LR. load_optimizer_state links them again."""
    from tula import config
    from tula.runtime.train.methods import build_method
    from tula.runtime.train.optim_state import load_optimizer_state

    t = config.from_dict({"train": {"method": method, "lr": 1.0}}).train
    p = [torch.nn.Parameter(torch.ones(3))]
    opt, _ = build_method(method, t, p, 64, 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.5**e)
    load_optimizer_state(opt, copy.deepcopy(opt.state_dict()))
    sched.last_epoch += 2  # as if two steps had been taken: the next step sets 0.5**3
    sched.step()
    inner = opt.optim
    assert inner.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.125
