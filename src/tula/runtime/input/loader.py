"""The input pipeline: every epoch's order, where training stands in it, and the DataLoaders
of training and evaluation (:class:`Loaders`, one rank's, decided once from ``data.*``), for
the probe, the production job and the suite alike. The batches on the device are
:mod:`tula.runtime.input.feed`'s.

Input order (:class:`EpochBatchSampler`): every epoch draws one permutation of the training
set (same seed on every rank); it is cut into global batches of B samples and rank r takes
every N-th sample of each, so the N workers together see each sample exactly once per
epoch. Where training stands is (epoch, samples consumed), independent of B: a requeue, or
a relaunch at a smaller B, continues with the next unseen sample. Random augmentations are
seeded per (seed, epoch, sample), so they do not depend on which loader worker ran them,
and a resumed run sees exactly the images an uninterrupted one would.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import os
import sys
import weakref
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Sampler
from torch.utils.data import Dataset as TorchDataset

from tula.config import Config, Data
from tula.runtime.group.dist import local_workers
from tula.runtime.input import decoding
from tula.runtime.input.data import Batched, WorkloadData, collate
from tula.runtime.input.images import decode_batch, decode_on_device, sample_seed


def next_chunk(train_samples: int, global_batch: int, offset: int, world: int) -> int:
    """Samples the next global batch takes from ``offset``; 0 when the epoch is over (a tail
    smaller than N cannot give every worker a sample and is left out)."""
    n = min(global_batch, train_samples - offset)
    return n if n >= world else 0


def epoch_permutation(train_samples: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(
        train_samples, generator=torch.Generator().manual_seed(seed * 100003 + epoch)
    )


class EpochBatchSampler(Sampler[list]):
    """This rank's share of every global batch of an epoch, from a sample offset on.

    Yields lists of ``(epoch, index)``; :class:`Seeded` uses the epoch to seed augmentations.
    :meth:`set_position` moves it (the loader's worker processes can stay alive: sampling
    runs in the training process)."""

    def __init__(self, train_samples: int, global_batch: int, rank: int, world: int, seed: int):
        self.n, self.batch, self.rank, self.world, self.seed = (
            train_samples,
            global_batch,
            rank,
            world,
            seed,
        )
        self.epoch, self.offset = 1, 0

    def set_position(self, epoch: int, offset: int) -> None:
        self.epoch, self.offset = epoch, offset

    def chunks(self) -> Iterator[tuple[int, int]]:
        """(offset, samples) of each global batch left in the epoch."""
        off = self.offset
        while (k := next_chunk(self.n, self.batch, off, self.world)) > 0:
            yield off, k
            off += k

    def __iter__(self) -> Iterator[list]:
        # a host list once per epoch
        perm = epoch_permutation(self.n, self.seed, self.epoch).tolist()
        for off, k in self.chunks():
            yield [(self.epoch, i) for i in perm[off + self.rank : off + k : self.world]]

    def __len__(self) -> int:
        steps, off = 0, self.offset
        while (k := next_chunk(self.n, self.batch, off, self.world)) > 0:
            steps, off = steps + 1, off + k
        return steps


class Seeded(TorchDataset):
    """Wraps a dataset indexed by ``(epoch, index)`` so that each sample's random augmentation
    depends on (seed, epoch, index) only, not on loader workers, their number, or where a
    resumed run started. An image folder draws its own from a per-sample generator
    (``seeded``); any other dataset's transforms draw from torch's RNG, seeded the same way
    for the sample and restored afterwards."""

    def __init__(self, base: TorchDataset, seed: int, encoded: bool = False):
        self.base, self.seed, self.encoded = base, seed, encoded
        self.batched = hasattr(base, "__getitems__")
        self.own_draws = hasattr(base, "seeded")

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key: tuple[int, int]):
        epoch, i = key
        if self.own_draws:
            return self.base.seeded(self.seed, epoch, i)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(sample_seed(self.seed, epoch, i))
            return self.base[i]

    def __getitems__(self, keys: list[tuple[int, int]]):
        if self.batched:  # in memory, no transforms: one indexing operation
            return self.base.__getitems__([i for _, i in keys])
        if self.encoded:  # file bytes and boxes, decoded on the device (images.decode_batch)
            return Batched(self.base.encoded(self.seed, keys[0][0], [i for _, i in keys]))
        return [self[k] for k in keys]


class ShardSampler(Sampler[list]):
    """Evaluation: rank r takes samples r, r+N, r+2N, ... in batches of ``batch``."""

    def __init__(self, size: int, batch: int, rank: int, world: int):
        self.idx = list(range(rank, size, world))
        self.batch = batch

    def __iter__(self) -> Iterator[list]:
        for i in range(0, len(self.idx), self.batch):
            yield [(0, j) for j in self.idx[i : i + self.batch]]

    def __len__(self) -> int:
        return math.ceil(len(self.idx) / self.batch)


MAX_AUTO_WORKERS = 16  # data.num_workers auto: loader processes per training worker at most


def cores_per_worker(world: int) -> int:
    """CPU cores this training worker may use: the cores this process may run on (SLURM binds
    a task to its --cpus-per-task) shared by this machine's training workers."""
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    return max(cores // max(local_workers(world), 1), 1)


def loader_workers(d: Data, data: WorkloadData, world: int) -> int:
    """``data.num_workers``: a number as given; ``auto`` = 0 for an in-memory set (one
    indexing operation per batch, no per-sample work to spread), else one loader process per
    core this training worker has beside its own (at most MAX_AUTO_WORKERS)."""
    if d.num_workers != "auto":
        return int(d.num_workers)
    if hasattr(data.train, "__getitems__"):
        return 0
    return min(cores_per_worker(world) - 1, MAX_AUTO_WORKERS)


# CPython before 3.11.8 (and 3.12.0) can leave a child forked while another thread holds the
# interpreter's lock waiting for it for ever (gh-112275, "HEAD_LOCK deadlock in child process
# after fork"). A training worker runs gloo's and earlier loaders' threads when its loaders
# fork their workers: in this project's test runs on 3.11.7 an evaluation loader's worker hung
# so right after the fork, and its rank with it. On such an interpreter loader workers start
# from a forkserver instead, which imports this module once; each worker forks from it warm.
def fork_deadlocks(version: tuple[int, int, int] = sys.version_info[:3]) -> bool:
    """Can this CPython's fork deadlock the child (gh-112275: fixed in 3.11.8 and 3.12.1)."""
    return version < (3, 11, 8) or (3, 12, 0) <= version < (3, 12, 1)


def worker_start() -> multiprocessing.context.BaseContext | None:
    """How loader workers start: a forkserver where this interpreter's fork can deadlock
    (:func:`fork_deadlocks`), else the DataLoader's default (None: fork on Linux)."""
    if not fork_deadlocks():
        return None
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tula.runtime.input.loader"])
    return ctx


def _loader_options(d: Data, workers: int, device: torch.device) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "num_workers": workers,
        "collate_fn": collate,
        "pin_memory": device.type == "cuda" if d.pin_memory == "auto" else bool(d.pin_memory),
    }
    if workers > 0:
        opts.update(persistent_workers=d.persistent_workers, prefetch_factor=d.prefetch_factor)
        opts["multiprocessing_context"] = worker_start()
    return opts


# -- the training set kept on the device ------------------------------------------------

# data.on_device auto: an in-memory set is kept on the GPU up to this share of its memory
RESIDENT_SHARE = 0.25


def resident_bytes(data: WorkloadData) -> int | None:
    """Bytes of an in-memory training set (inputs and labels), None for one read per sample."""
    train = data.train
    if not (hasattr(train, "x") and hasattr(train, "y") and hasattr(train, "__getitems__")):
        return None
    return train.x.numel() * train.x.element_size() + train.y.numel() * train.y.element_size()


def keep_on_device(cfg: Config, data: WorkloadData, device: torch.device) -> bool:
    """``data.on_device``: keep the in-memory training set on the device, each batch a gather
    there? auto: on CUDA, where the set takes at most RESIDENT_SHARE of the device's memory
    (hardware.device_memory_gb less its margin, else the device's own): the memory probe
    measures with it there, so the memory model's fixed part holds it. true: wherever the set
    is in memory (on CPU the same tensors, no DataLoader); false: never."""
    budget = cfg.hardware.memory_budget_bytes
    if budget is None and device.type == "cuda":
        budget = torch.cuda.get_device_properties(device).total_memory
    return resident_by_rule(cfg.data.on_device, device.type, resident_bytes(data), budget)


def resident_by_rule(
    on_device: bool | str, device_type: str, nbytes: int | None, budget: float | None
) -> bool:
    """:func:`keep_on_device`'s rule on what it reads: ``data.on_device``, the device's type,
    the set's bytes (None: not in memory) and the memory budget (None: unknown, not kept);
    ``tula check`` asks it too, to count the set in the estimate's fixed part."""
    if nbytes is None or on_device is False:
        return False
    if on_device is True:
        return True
    if device_type != "cuda" or budget is None:
        return False
    return nbytes <= RESIDENT_SHARE * budget


# every DataLoader with worker processes this process made: shut down while it still runs
_WITH_WORKERS: weakref.WeakSet[DataLoader] = weakref.WeakSet()


def _made(loader: DataLoader) -> DataLoader:
    if loader.num_workers > 0:
        _WITH_WORKERS.add(loader)
    return loader


def close_loaders() -> None:
    """Stop every loader's worker processes now, at the process's end (persistent workers live
    until their loader is collected: left to the interpreter's exit, on a forkserver each join
    waited out its 5 s timeout). The loaders cannot be iterated again."""
    for loader in list(_WITH_WORKERS):
        it = getattr(loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
    _WITH_WORKERS.clear()


class Loaders:
    """One rank's DataLoaders as ``data.*`` asks for them, decided here once: the loader
    workers and their options, the seed, the evaluation batch, whether the training set stays
    on the device (:func:`keep_on_device`), how an encoded batch is decoded there, and whether
    ``data.decode: auto`` is left to measuring (:mod:`tula.runtime.input.decoding`). The replica
    builds one; its stream and its evaluator ask it for loaders and read no config."""

    def __init__(
        self, cfg: Config, data: WorkloadData, rank: int, world: int, device: torch.device
    ):
        self.data, self.rank, self.world, self.device = data, rank, world, device
        self.seed, self.eval_batch = cfg.workload.seed, cfg.data.eval_batch_size
        self.options = _loader_options(cfg.data, loader_workers(cfg.data, data, world), device)
        self.resident = keep_on_device(cfg, data, device)
        # an encoded batch (JPEG files) into the step's input, on the device, with data.*'s views
        self.decode = functools.partial(decode_batch, d=cfg.data, device=device)
        self.encoded = decode_on_device(cfg.data, device.type, data.train)  # data.decode's say
        # both decoders can serve and data.decode is auto: the stream measures which is faster
        self.contested = decoding.contested(cfg.data, device.type, data.train)

    def train(
        self, global_batch: int, decode: str | None = None
    ) -> tuple[DataLoader, EpochBatchSampler]:
        """The training DataLoader at ``global_batch`` and its sampler (position it before
        iterating). ``decode``: cpu or gpu where it was measured (a contested set: every file
        a JPEG, so nvJPEG can read it), else as ``data.decode`` says."""
        sampler = EpochBatchSampler(
            self.data.train_size, global_batch, self.rank, self.world, self.seed
        )
        encoded = self.encoded if decode is None else decode == "gpu"
        seeded = Seeded(self.data.train, self.seed, encoded)
        return _made(DataLoader(seeded, batch_sampler=sampler, **self.options)), sampler

    def eval(self, batch_size: int | None = None) -> DataLoader:
        """The test set sharded over the ranks, ``batch_size`` (default
        ``data.eval_batch_size``) samples per worker and batch."""
        sampler = ShardSampler(
            self.data.test_size, batch_size or self.eval_batch, self.rank, self.world
        )
        return _made(
            DataLoader(Seeded(self.data.test, self.seed), batch_sampler=sampler, **self.options)
        )
