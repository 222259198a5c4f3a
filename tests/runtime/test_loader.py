"""The input pipeline (tula.runtime.input.loader): every epoch is one permutation split over the
ranks, and where training stands is in samples, so a relaunch at another batch consumes every
sample of the epoch exactly once."""

import numpy as np
import pytest

from tula.model.grid import steps_per_epoch
from tula.runtime.input import loader
from tula.runtime.input.feed import DeviceFeed


def consumed(n, batch, world, seed, epoch, start, stop_after=None):
    """Indices every rank's sampler yields from ``start`` (optionally only the first steps)."""
    samplers = [loader.EpochBatchSampler(n, batch, r, world, seed) for r in range(world)]
    out, steps = [], 0
    for s in samplers:
        s.set_position(epoch, start)
    for parts in zip(*samplers):
        if stop_after is not None and steps == stop_after:
            break
        out += [i for part in parts for _, i in part]
        steps += 1
    return out, steps


def test_each_epoch_is_a_permutation_split_over_the_ranks():
    idx, steps = consumed(103, 16, 2, seed=0, epoch=3, start=0)
    assert sorted(idx) == list(range(103)) and steps == 7 == steps_per_epoch(103, 16)
    # a new order every epoch
    assert consumed(103, 16, 2, 0, 3, 0)[0] != consumed(103, 16, 2, 0, 4, 0)[0]


def test_the_steps_of_an_epoch_are_the_ones_the_loader_yields():
    """A tail smaller than N is left out (every worker must get a sample): 101 samples at B = 16
    end in 5, trained on 4 workers (7 steps), left out on 8 (6 steps, 96 samples); the grid's
    steps per epoch, the probe's mix of steps and the first steps priced apart say the same."""
    from tula.model.grid import paid_mix, short_last_batch
    from tula.model.predictions import shapes_apart

    for world, steps, samples in ((4, 7, 101), (8, 6, 96)):
        idx, n = consumed(101, 16, world, seed=0, epoch=0, start=0)
        assert (n, len(idx)) == (steps, samples) == (steps_per_epoch(101, 16, world), samples)
        assert short_last_batch(101, 16, world) == (world == 4)
        assert ("partial" in paid_mix(101, 16, world, 0.0)) == (world == 4)
        assert shapes_apart(101, 16, world) == (2 if world == 4 else 1)
    assert steps_per_epoch(101, np.array([16, 32, 128]), np.array([8, 4, 2])).tolist() == [6, 4, 1]


def test_a_relaunch_at_a_smaller_batch_consumes_every_sample_exactly_once():
    n, world = 1000, 2
    # 3 steps at B=128, then OOM
    first, steps = consumed(n, 128, world, seed=5, epoch=2, start=0, stop_after=3)
    offset = 3 * 128
    # relaunch at B=32 from the checkpoint
    rest, _ = consumed(n, 32, world, seed=5, epoch=2, start=offset)
    assert len(first) == offset and sorted(first + rest) == list(range(n))


def test_a_tail_smaller_than_n_is_left_out():
    idx, steps = consumed(10, 4, 3, seed=0, epoch=1, start=0)  # 4 + 4, then 2 < 3 workers
    assert steps == 2 and len(idx) == 8 and loader.next_chunk(10, 4, 8, 3) == 0


def test_the_resident_gather_yields_the_loaders_batches_in_its_order_from_any_position():
    """data.on_device: the training set kept on the device and each batch gathered there gives
    the DataLoader's batches, value for value, in the sampler's order: every sample once per
    epoch, and a resumed run (a position mid-epoch) goes on alike. On CPU both paths run for
    real; on CUDA the gather runs on the device (bench/gpu_step.py)."""
    import torch

    from tula import config
    from tula.runtime.input import data as data_mod

    cfg = {
        o: config.from_dict({"workload": {"dataset": "digits"}, "data": {"on_device": o}})
        for o in (True, False)
    }
    data = data_mod.load_config(cfg[True])
    for rank, world, epoch, offset in ((0, 1, 1, 0), (1, 2, 3, 0), (0, 2, 2, 320)):
        got = {}
        for on, c in cfg.items():
            loaders = loader.Loaders(c, data, rank, world, torch.device("cpu"))
            ld, sampler = loaders.train(64)
            feed = DeviceFeed.of(loaders, ld, sampler, channels_last=False)
            assert feed.resident is on
            sampler.set_position(epoch, offset)
            got[on] = list(feed)
        assert len(got[True]) == len(got[False]) == len(sampler) > 0
        for (xa, ya), (xb, yb) in zip(got[True], got[False]):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # the whole epoch from the start: every sample once over the ranks
    seen = []
    for rank in (0, 1):
        loaders = loader.Loaders(cfg[True], data, rank, 2, torch.device("cpu"))
        ld, sampler = loaders.train(64)
        sampler.set_position(1, 0)
        seen += [x for x, _ in DeviceFeed.of(loaders, ld, sampler, False)]
    assert sum(len(x) for x in seen) == data.train_size  # 1437: the short last batch split 15 + 14


@pytest.mark.parametrize(
    "version, deadlocks",
    [
        ((3, 11, 7), True),
        ((3, 11, 8), False),
        ((3, 12, 0), True),
        ((3, 12, 1), False),
        ((3, 13, 2), False),
        ((3, 10, 14), True),
    ],
)
def test_loader_workers_fork_only_where_the_child_cannot_deadlock(version, deadlocks):
    """CPython's gh-112275 (a child forked while another thread held the interpreter's lock
    waits for ever; fixed in 3.11.8 and 3.12.1): where it can happen, loader workers start
    from a forkserver instead."""
    assert loader.fork_deadlocks(version) is deadlocks


def test_a_ranks_loaders_are_decided_once_and_what_reads_them_keeps_no_config():
    """`Loaders` reads data.* (and the seed, the memory budget) as it is built; the stream and
    the evaluator it serves hold no config or section, and their loaders follow its decisions:
    the evaluation batch, the resident set, the seed's order."""
    import torch

    from tula import config
    from tula.runtime.input import data as data_mod
    from tula.runtime.step.evaluation import Evaluator
    from tula.runtime.step.stream import Stream

    cfg = config.from_dict(
        {"workload": {"dataset": "digits", "seed": 5}, "data": {"eval_batch_size": 50}}
    )
    data = data_mod.load_config(cfg)
    loaders = loader.Loaders(cfg, data, 1, 2, torch.device("cpu"))
    stream, evaluator = Stream(loaders, 64, False), Evaluator(loaders)
    for owner in (loaders, stream, evaluator):
        held = [k for k, v in vars(owner).items() if type(v).__module__ == "tula.config"]
        assert held == [], (type(owner).__name__, held)
    assert (loaders.seed, loaders.eval_batch, loaders.resident) == (5, 50, False)
    assert not loaders.contested and stream.decode is None  # digits: no files to decode
    assert evaluator.batch == 50 and evaluator.rank == 1
    assert len(next(iter(evaluator._loader_at(evaluator.batch)))[0]) == 50
    # rank 1 of 2 at B = 64: every other sample of the seed's first 64 of epoch 1
    x, y = next(stream.batches(1))
    order = loader.epoch_permutation(data.train_size, 5, 1)[1:64:2]
    assert torch.equal(y, data.train.y[order])


def test_the_loaders_workers_are_stopped_while_the_process_still_runs():
    """Persistent loader workers (started as training starts them: a forkserver on this
    CPython) live until their loader is collected; left to the interpreter's exit, each join
    waited out its 5 s timeout (a tula launch on an image folder idled 22 s after training).
    close_loaders, which every worker's exit hook calls first (tula.runtime.group.dist), stops them:
    none is alive after it, mid-epoch or not."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from tula.runtime.group import dist

    ds = TensorDataset(torch.arange(64.0))
    opts = dict(
        num_workers=2, persistent_workers=True, multiprocessing_context=loader.worker_start()
    )
    loaders = [loader._made(DataLoader(ds, batch_size=8, **opts)) for _ in range(2)]
    procs = []
    for dl in loaders:
        it = iter(dl)
        next(it)  # mid-epoch
        procs += list(it._workers)
    assert len(procs) == 4 and all(p.is_alive() for p in procs)
    assert set(loaders) <= set(loader._WITH_WORKERS)
    dist._collect_groups()  # the exit hook, as atexit runs it
    assert not any(p.is_alive() for p in procs)
    assert not list(loader._WITH_WORKERS)
