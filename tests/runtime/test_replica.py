"""The one training step (tula.runtime.step.replica): in one process group here (the multi-process
runs are the trainer's, the launcher's and the probe's tests); mixed precision gives AGS
unscaled gradients, a skipped fp16 step is not a Delta sample, and the position in the epoch
moves by samples whatever the batch."""

import tempfile

import pytest
import torch
import torch.distributed as torch_dist

import bounds
from conftest import bitwise_equal
from tula import config
from tula.runtime.step.replica import Replica
from tula.runtime.train.methods import Cadence
from tula.runtime.train.optim import TulaOptimizer


def _replica(precision, method="ags"):
    cfg = config.from_dict({"train": {"precision": precision, "method": method, "ags_delta": 1e9}})
    return Replica(cfg, torch.device("cpu"), 64, 0, 1)


@pytest.fixture
def one_process_group():
    with tempfile.NamedTemporaryFile() as f:
        torch_dist.init_process_group("gloo", init_method=f"file://{f.name}", rank=0, world_size=1)
        yield
        torch_dist.destroy_process_group()


def test_fp16_gradscaler_ags_sees_unscaled_gradients(one_process_group):
    """Same weights, same batch: fp16 with a loss scale of 2^16 gives AGS the Δ(G) inputs and
    scale factors that fp32 gives, to fp16 precision, not 2^16 (or 2^32) times them."""
    r16, r32 = _replica("fp16"), _replica("fp32")
    assert (
        r16.update.scaler.is_enabled()
        and r16.update.scaler.get_scale() == 2.0**16
        and not r32.update.scaler.is_enabled()
    )
    batch = next(r32.walk.epoch_batches())
    for r in (r16, r32):
        r.step(*batch)  # first step of the epoch: AGS refreshes its factors
    o16, o32 = r16.update.opt, r32.update.opt
    assert (
        isinstance(o16, TulaOptimizer)
        and o16.counters["refreshes"] == o32.counters["refreshes"] == 1
    )
    assert o16.prev_sq_norm == pytest.approx(o32.prev_sq_norm, rel=bounds.FP16)
    s16, s32 = (
        torch.cat([s.flatten() for s in o16.scales()]),
        torch.cat([s.flatten() for s in o32.scales()]),
    )
    assert torch.median((s16 - s32).abs()) < bounds.FP16 and 0 < s32.mean() < o32.s_max


def test_fp16_step_the_scaler_skips_is_not_a_delta_sample(one_process_group):
    r = _replica("fp16")
    batches = r.walk.epoch_batches()
    r.step(*next(batches))
    norm, steps = r.update.opt.prev_sq_norm, r.update.opt.counters["steps"]
    # the next backward overflows fp16: the scaler must skip the step
    huge = 1e38
    r.update.scaler.update(new_scale=huge)
    before = {k: v.detach().clone() for k, v in r.ddp.module.named_parameters()}
    r.step(*next(batches))
    # no Δ sample, no AGS step
    assert r.update.opt.counters["steps"] == steps and r.update.opt.prev_sq_norm == norm
    # the weights did not move (BatchNorm's running statistics do: the forward ran)
    assert (
        bitwise_equal(dict(r.ddp.module.named_parameters()), before)
        and r.update.scaler.get_scale() < huge
    )
    assert r.walk.pos.step == 2  # the position still moved on: that batch's samples were consumed


def test_the_step_moves_the_position_by_samples_and_kinds_follow_the_epoch(one_process_group):
    """digits: 1437 training samples; at B=64 an epoch is 22 full steps and a short one of 29.
    next_timed_step says which kind each step was, and starts the next epoch when one ends."""
    r = _replica("fp32", method="lbt")
    kinds = [r.walk.next_timed_step()[1] for _ in range(24)]
    assert kinds == ["start"] + ["plain"] * 21 + ["partial", "start"]
    assert (r.walk.pos.step, r.walk.pos.epoch, r.walk.pos.offset) == (24, 2, 64)
    # the sweep's way to another batch: same model and step, from an epoch start
    r.set_global_batch(32)
    assert (r.walk.pos.offset, r.steps_per_epoch) == (0, 45) and r.walk.next_timed_step()[
        1
    ] == "start"
    assert r.walk.pos.offset == 32 and r.walk.pos.epochs_done(1437) == pytest.approx(1 + 32 / 1437)
    loss, acc = r.evaluate()
    assert loss > 0 and 0 <= acc <= 1 and r.evaluator.retries == []


def test_a_parked_batch_is_taken_up_where_it_was_left(one_process_group):
    """The sweep's rounds: a batch parked mid-epoch continues there (the same loader), with the
    step count going on; one not parked starts an epoch."""
    r = _replica("fp32", method="lbt")
    [r.walk.next_timed_step() for _ in range(3)]
    assert (r.walk.pos.step, r.walk.pos.offset) == (3, 192)
    r.set_global_batch(32, park=True)
    assert r.walk.next_steps(4) == (1, "start") and r.walk.next_steps(4) == (4, "plain")
    r.set_global_batch(64, park=True)
    assert (r.walk.pos.step, r.walk.pos.offset) == (8, 192) and r.walk.next_steps(2) == (2, "plain")
    r.set_global_batch(32)  # 64 not parked: gone; 32 was parked at 160 samples
    assert (r.walk.pos.offset, r.steps_per_epoch) == (160, 45)
    r.set_global_batch(64)
    assert r.walk.pos.offset == 0 and r.walk.next_steps(2) == (1, "start")


@pytest.mark.parametrize("every", [None, 4])
def test_a_run_of_steps_holds_plain_steps_only(one_process_group, every):
    """The timer times runs of plain steps (a block on a device with a queue); an epoch's first
    step, its short last batch and a mid-epoch AGS refresh are never inside a run: each is run
    alone, with its kind: timings a GPU can trust."""
    cfg = config.from_dict({"train": {"ags_refresh_every_steps": every}})
    # digits: 1437 samples, 22 full batches and one of 29
    r = Replica(cfg, torch.device("cpu"), 64, 0, 1)
    seen = []
    while [k for k, _ in seen].count("partial") < 2:  # two epochs
        offset, step = r.walk.pos.offset, r.walk.pos.step
        n, kind = r.walk.next_steps(5)
        seen.append((kind, n))
        assert 1 <= n <= 5
        if kind == "plain":
            assert offset > 0 and offset + n * 64 <= 1437 - 29  # full batches of one epoch
            assert not every or (step % every) + n <= every  # no refresh inside
        else:
            assert n == 1
        if kind == "start":
            # the last epoch closed, the new one's first batch
            assert offset in (0, 1437) and r.walk.pos.offset == 64
    kinds = [k for k, _ in seen]
    assert kinds.count("start") == 2 and kinds.count("partial") == 2
    # not the starts
    refreshes = [s for s in range(2 * 23) if every and s % every == 0 and s not in (0, 23)]
    assert kinds.count("refresh") == len(refreshes)
    assert sum(n for k, n in seen if k == "plain") + kinds.count("refresh") == 2 * 21


def test_the_sweep_times_each_compute_only_step_after_a_synced_one(one_process_group, monkeypatch):
    """The compute sweep's rounds (tula.runtime.probe.sweep): every timed compute-only step follows
    an untimed synced step at the same batch, as the probe's alternation and training meet
    it; back to back, two workers' compute-only steps read 10-30 % faster than that."""
    from tula.runtime.probe import probe_timing, sweep
    from tula.runtime.timer.timing import Target

    r = _replica("fp32")
    events = []
    run_step = r.walk.run_step

    def logged(*args, **kwargs):
        events.append("synced" if r.ddp.require_backward_grad_sync else "compute")
        return run_step(*args, **kwargs)

    monkeypatch.setattr(r.walk, "run_step", logged)
    # a precision never reached and a budget spent at once: one round of ROUND_STEPS each
    timer = probe_timing.step_timer(r, Target(0.0, 3, 0.0), None)
    begin = timer.clock.begin
    monkeypatch.setattr(timer.clock, "begin", lambda: events.append("timed") or begin())
    series = sweep._rounds(r, timer, [16, 32], 1, 1)
    assert events.count("timed") == 2 * sweep.ROUND_STEPS
    # one synced step before each timed one, more only where an epoch's edge was next
    assert events.count("compute") == events.count("timed") <= events.count("synced")
    for i, e in enumerate(events):
        if e == "timed":
            assert events[i - 1] == "synced" and events[i + 1] == "compute", events
    assert all(s.n_steps + sum(map(len, s.other.values())) == 4 for s in series.values())


def test_a_uint8_sets_training_step_feeds_the_model_its_batch_standardised_once(
    one_process_group, tmp_path
):
    """On a uint8 npz set the model's first layer sees, in a training step and in evaluation,
    each batch standardised exactly once, on either feed (the DataLoader's, the resident
    copy's). Standardised twice in training, BatchNorm's running statistics were not those
    evaluation meets: small_cnn reached 96 % training accuracy and 26 % on the test set, and
    10 % in eval mode on its own training samples."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(256, 1, 8, 8), dtype=np.uint8)
    y = np.arange(256) % 10
    path = tmp_path / "u8.npz"
    np.savez(path, x_train=x, y_train=y, x_test=x[:64], y_test=y[:64])
    for on_device in (False, True):
        cfg = config.from_dict(
            {"workload": {"dataset": f"npz:{path}"}, "data": {"on_device": on_device}}
        )
        r = Replica(cfg, torch.device("cpu"), 64, 0, 1)
        seen = []
        hook = r.ddp.module.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
        r.walk.pos.offset = 0
        batch = next(r.walk.epoch_batches())
        r.step(*batch)
        r.evaluate()
        hook.remove()
        # every row the step's forward passes fed (AGS's refresh too) is a training sample
        # standardised once; every row evaluation fed (its one batch), a test sample
        assert len(seen) >= 2
        fed_by = [(x, r.data.train.x) for x in seen[:-1]] + [(seen[-1], r.data.test.x)]
        for fed, stored in fed_by:
            once = r.data.as_input(stored).flatten(1)
            dist = torch.cdist(fed.flatten(1), once, compute_mode="donot_use_mm_for_euclid_dist")
            assert len(fed) >= 32 and dist.min(dim=1).values.max() < bounds.FLOAT32_SUM, on_device


@pytest.mark.parametrize(
    "train, due, per_step, differ",
    [
        ({"method": "ags"}, [True, False, False, False, False], 0.0, False),
        (
            {"method": "ags", "ags_refresh_every_steps": 4},
            [True, False, False, False, True],
            0.25,
            False,
        ),
        ({"method": "lbt", "ags_refresh_every_steps": 4}, [False] * 5, 0.0, False),
        ({"method": "polo"}, [False] * 5, 0.0, True),
    ],
)
def test_the_cadence_is_the_methods_own_resolved_once(train, due, per_step, differ):
    """What of train.method the step, the epoch's walk, the monitor and the checkpoint ask
    (Cadence): AGS refreshes at an epoch's first step or every k steps, other methods never;
    post-local SGD's ranks differ. Steps 0-4 of an epoch whose first step is step 0."""
    c = Cadence.of(config.from_dict({"train": train}).train)
    assert [c.refresh_due(step == 0, step) for step in range(5)] == due
    assert c.midepoch_refreshes_per_step() == per_step and c.replicas_differ is differ


def test_the_replica_keeps_no_config_section(one_process_group):
    """The replica resolves what it needs of the config as it is built (Cadence, the LR
    schedule): no field of it holds the config or a section, so what a step depends on is
    what it was given, not whatever a section may grow."""
    r = _replica("fp32")
    fields = {**vars(r), **vars(r.update)}
    held = [k for k, v in fields.items() if type(v).__module__ == "tula.config"]
    assert held == [] and r.cadence == Cadence("ags", None) and r.compile == "off"
    # AGS: the base LR, no warm-up
    u = r.update
    assert u.lr_plan.peak(64) == u.opt.param_groups[0]["lr"] == u.lr == 0.05 and u.sched.warm == 0


def plain_net(in_shape, num_classes):
    """No batch norm, no dropout: a batch's gradient is its micro-batches' weighted sum."""
    size = int(torch.tensor(in_shape).prod())
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(size, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    )


def _accumulating(accumulate, method="lbt", max_micro_batch=None):
    cfg = config.from_dict(
        {
            "workload": {"model": "test_replica:plain_net"},
            "train": {"method": method, "accumulate": accumulate, "ags_small_batch": 8},
        }
    )
    r = Replica(cfg, torch.device("cpu"), 64, 0, 1, max_micro_batch=max_micro_batch)
    calls = []

    def counted(state, bucket):  # DDP's gradient all-reduce, counted
        calls.append(bucket.index())
        return (
            torch_dist.all_reduce(bucket.buffer(), async_op=True)
            .get_future()
            .then(lambda f: f.value()[0])
        )

    r.ddp.register_comm_hook(None, counted)
    return r, calls


@pytest.mark.parametrize("method", ["lbt", "ags"])
def test_an_accumulated_step_is_the_whole_batchs_step_with_one_all_reduce(
    one_process_group, method
):
    """train.accumulate: the batch of 64 as 4 micro-batches of 16 (fixed, or auto under a
    b_max of 16) moves the weights as the whole batch does, to float rounding (the sums are
    added in another order), with the gradient all-reduced once, in the last micro-batch;
    the epoch's loss sum is the whole batch's; under AGS the refresh reads the same pair of
    squared norms (its reference sub-batch, the batch's first 8 samples, and the whole
    batch's gradient)."""
    whole, whole_calls = _accumulating(1, method)
    fixed, fixed_calls = _accumulating(4, method)
    auto, auto_calls = _accumulating("auto", method, max_micro_batch=16)
    batch = next(whole.walk.epoch_batches())
    fixed.spans.on = True  # the probe's compute-only arm times each micro-batch's part
    for r in (whole, fixed, auto):
        r.step(*batch)  # an epoch's first step: AGS refreshes its factors
    # 3 micro-batches before the synced one, then its forward and its backward, apart
    assert len(fixed.spans.handles) == 5 and fixed.spans.take() > 0 and not fixed.spans.handles
    assert not auto.spans.handles  # off: nothing timed
    for r, calls in ((fixed, fixed_calls), (auto, auto_calls)):
        assert calls == whole_calls and len(set(calls)) == len(calls) > 0
        for p, q in zip(whole.ddp.module.parameters(), r.ddp.module.parameters()):
            assert torch.allclose(p, q, rtol=1e-5, atol=1e-7)
        assert r.walk.stats[0].item() == pytest.approx(whole.walk.stats[0].item(), rel=1e-6)
        if method == "ags":
            (small, large), (small_k, large_k) = (
                whole.update.noise_pairs[0],
                r.update.noise_pairs[0],
            )
            assert (small_k, large_k) == pytest.approx((small, large), rel=1e-5)
    moved = [p.detach() for p in whole.ddp.module.parameters()]
    assert not all(
        torch.equal(a, b) for a, b in zip(moved, _accumulating(1)[0].ddp.module.parameters())
    )
