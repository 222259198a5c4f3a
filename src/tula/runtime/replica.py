"""The one training step (paper §III-C, §IV-B): what the probe, the production job and the
generalization suite all run.

:class:`Replica` is one data-parallel worker and owns the step's state: the workload's data
and DataLoader, the DDP model, the ``train.method`` optimizer, its LR schedule, autocast and
GradScaler and AGS's noise pairs; where training stands, the epoch's sums and the kind of the
next step (its part ``walk``, :class:`tula.runtime.epoch_walk.EpochWalk`); its
:class:`tula.runtime.evaluation.Evaluator`; and the :class:`StepHooks` the job gives it.
Other modules change that state only through its methods. :meth:`Replica.step`:
    forward under autocast -> one all-reduce of (OOM, stop) flags that every rank agrees on
    -> backward (DDP's bucketed gradient all-reduce) -> unscale -> AGS refresh when due
    -> optimizer step through the GradScaler -> LR schedule -> loss/accuracy sums on device.

Out of memory is agreed on wherever a collective follows that every rank makes anyway (the
step's flags, AGS's refresh all-reduce, evaluation's sums, one all-reduce after a
checkpoint) and raised on every rank as :class:`tula.runtime.agreement.StepOOM`; in
backward, where the peers wait inside DDP's all-reduce, the failing rank leaves a record
(``oom/``) instead (:mod:`tula.production.trainer`). The timer (:mod:`tula.runtime.timing`)
times around the walk's steps (:meth:`tula.runtime.epoch_walk.EpochWalk.next_steps`);
compute-only steps are them under ``DDP.no_sync()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Callable, Iterator

import torch
import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tula import config as config_mod
from tula import model_inputs
from tula.model.grid import steps_per_epoch
from tula.runtime import data as data_mod
from tula.runtime import loader, recipe
from tula.runtime.agreement import StepOOM, agree_host
from tula.runtime.clocks import clock_for
from tula.runtime.epoch_walk import EpochWalk
from tula.runtime.evaluation import Evaluator
from tula.runtime.methods import Cadence, build_method
from tula.runtime.nets import build_model, compiled
from tula.runtime.optim import TulaOptimizer
from tula.runtime.refresh import refresh_scales
from tula.runtime.replica_state import ReplicaState
from tula.runtime.stepstate import StepHooks
from tula.runtime.stream import Stream
from tula.runtime.timing import StepTimer

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Replica(ReplicaState):
    """One worker's model, optimizer and data, and the training step (what a checkpoint holds
    of it, loading it and undoing steps: :class:`ReplicaState`). Where it stands in its epoch
    and the kind of its next step are its part ``walk`` (:class:`EpochWalk`), which each step
    reports to. ``data``: the workload's sets loaded already in this process (a probe job's
    later points)."""

    def __init__(
        self,
        cfg: config_mod.Config,
        device: torch.device,
        global_batch: int,
        rank: int,
        world: int,
        hooks: StepHooks | None = None,
        data: data_mod.WorkloadData | None = None,
    ):
        t = cfg.train
        self.device, self.rank, self.world = device, rank, world
        self.data = data if data is not None else data_mod.load_config(cfg)
        torch.manual_seed(cfg.workload.seed)  # same initial weights on every rank
        model = build_model(cfg.workload.model, self.data.input_shape, self.data.num_classes)
        self.channels_last = t.channels_last and len(self.data.input_shape) == 3
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        model = model.to(device)
        self.ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        # what the step's forward calls (train.compile, as the probe's record says it)
        self.net, self.compile = compiled(self.ddp) if t.compile == "on" else self.ddp, t.compile
        self.steps_per_epoch = steps_per_epoch(self.data.train_size, global_batch, self.world)
        self.opt, prepare_ddp = build_method(
            t.method, t, list(self.ddp.parameters()), global_batch, self.steps_per_epoch
        )
        prepare_ddp(self.ddp)
        # what of train.method the step, the epoch's walk, the monitor and the checkpoint ask
        self.cadence = Cadence.of(t)
        # the LR schedule (warm-up, then train.schedule) over the run's epochs, per step
        self.lr_plan, self.epochs = model_inputs.lr_plan(t), cfg.workload.epochs
        self.autocast_dtype = AUTOCAST_DTYPES[t.precision]
        self.scaler = torch.amp.GradScaler(device.type, enabled=t.precision == "fp16")
        self.loss_fn, self.metric_sum = recipe.build_loss(t), recipe.build_metric(t)
        self.small_local = max(1, t.ags_small_batch // world)
        # where in the step (or evaluation) this rank is: forward, backward, refresh, eval
        self.phase = "forward"
        self.hooks = dataclasses.replace(hooks or StepHooks(), injector=None)
        self.inject_faults((hooks or StepHooks()).injector)
        loaders = loader.Loaders(cfg, self.data, rank, world, device)  # data.*, decided once
        self.evaluator = Evaluator(loaders)
        # this epoch's AGS refreshes: (|G_small|^2, |G_B|^2)
        self.noise_pairs: list[tuple[float, float]] = []
        self.stream = Stream(loaders, global_batch, self.channels_last)
        # the device's clock (events on CUDA, the host's elsewhere): one-off steps timed alone
        self.timer = StepTimer(clock_for(device, self.sync_device))
        batches = (global_batch, world)
        self.walk = EpochWalk(
            self.data, self.stream, self.timer, self.cadence, batches, self.step, device
        )
        self.sched = self.new_schedule()

    # -- what the replica shows outside the runtime (read-only views) -----------------
    @property
    def global_batch(self) -> int:
        """The global batch the steps run at (:meth:`set_global_batch` changes it)."""
        return self.walk.global_batch

    @property
    def steps_done(self) -> int:
        """Optimizer steps taken since the run began (counting the resumed ones)."""
        return self.walk.pos.step

    @property
    def epoch(self) -> int:
        """The epoch being trained, from 1 (past the last one once training ended)."""
        return self.walk.pos.epoch

    @property
    def epoch_offset(self) -> int:
        """Samples of this epoch already stepped over."""
        return self.walk.pos.offset

    @property
    def epochs_done(self) -> float:
        """Epochs trained so far, the one in progress by the share of its samples stepped."""
        return self.walk.pos.epochs_done(self.data.train_size)

    @property
    def refreshes_next(self) -> bool:
        """Will the next step refresh AGS's factors (asked for, or due by the cadence)?"""
        return self.walk.refreshes_next

    @property
    def last_step(self) -> tuple[torch.Tensor, int]:
        """The last step's loss (on the device, read where it syncs) and its samples."""
        return self.walk.last_loss, self.walk.last_chunk

    @property
    def lr(self) -> float:
        """The learning rate the next step takes (the first parameter group's)."""
        return float(self.opt.param_groups[0]["lr"])

    @property
    def loader_workers(self) -> int:
        """The training DataLoader's worker processes (0: the batches are read in this one)."""
        return self.stream.loader.num_workers

    @property
    def decode(self) -> dict | None:
        """How images are decoded on the device (data.decode: gpu), and why; None otherwise."""
        return self.stream.decode

    @property
    def on_device(self) -> bool:
        """Does the training set live on the device (data.on_device), fed from there?"""
        return self.stream.feed.resident

    def ags_counters(self) -> dict | None:
        """AGS's (or static scaling's) counters of the steps it scaled; None for another
        method."""
        return dict(self.opt.counters) if isinstance(self.opt, TulaOptimizer) else None

    def ags_scaled_so_far(self) -> torch.Tensor | None:
        """AGS's count of scaled steps, on the device (read without waiting); None for
        another method."""
        return self.opt.scaled_so_far() if isinstance(self.opt, TulaOptimizer) else None

    def ags_mean_factor(self) -> float | None:
        """AGS's mean scale factor over the layers now; None for another method."""
        return self.opt.mean_factor() if isinstance(self.opt, TulaOptimizer) else None

    # -- pieces of the step ------------------------------------------------------------
    def new_schedule(self) -> recipe.Schedule:
        """The LR schedule at this global batch, from its first step (the run's epochs at it)."""
        return recipe.Schedule(
            self.opt,
            self.lr_plan,
            self.global_batch,
            self.steps_per_epoch,
            self.epochs * self.steps_per_epoch,
        )

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def to_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.data.as_input(x.to(self.device, non_blocking=True))
        if self.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y.to(self.device, non_blocking=True)

    def forward_loss(
        self, x: torch.Tensor, y: torch.Tensor, eager: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, loss) under the configured precision; x, y already on the device. ``eager``:
        the uncompiled model (the memory count of Eq. 3 hooks autograd's saved tensors)."""
        with self.autocast():
            logits = (self.ddp if eager else self.net)(x)
            return logits, self.loss_fn(logits, y)

    def sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def free_cached_memory(self) -> None:
        """After an out-of-memory error: give the allocator's cached blocks back."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def inject_faults(self, injector: Callable[[str, int, int], None] | None) -> None:
        """From now on, ``injector(place, step, global batch)`` (:class:`tula.faults.Injector`) is
        called in the model's forward (the phase says which), at backward's start and at
        :meth:`inject`. The probe arms it after its memory step, whose forward has no agreement."""
        if injector is None or self.hooks.injector is not None:
            return
        self.hooks = dataclasses.replace(self.hooks, injector=injector)
        self.ddp.module.register_forward_pre_hook(lambda m, a: self.inject(self.phase))

    def inject(self, place: str) -> None:
        """A fault drill's error due at ``place`` now (nothing without an injector)."""
        if self.hooks.injector is not None:
            self.hooks.injector(place, self.steps_done, self.global_batch)

    @contextlib.contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        """Code that runs the model outside the step (evaluation): the phase a fault sees."""
        self.phase = phase
        try:
            yield
        finally:
            self.phase = "forward"

    # -- the step ----------------------------------------------------------------------
    def step(self, x: torch.Tensor, y: torch.Tensor) -> int:
        """One training step on this rank's share of the next global batch. Returns the stop
        code every rank agreed on (0: go on); raises :class:`StepOOM` on every rank together
        when any rank ran out of memory moving the batch to the device, in the forward pass or
        in AGS's refresh. An out-of-memory error in backward cannot be agreed on (the peers
        are inside DDP's gradient all-reduce): it propagates, and :class:`Trainer` records it."""
        chunk = self.walk.next_chunk()
        self.opt.zero_grad(set_to_none=True)
        oom, self.phase = "", "forward"
        try:
            x, y = self.to_device(x, y)
            logits, loss = self.forward_loss(x, y)
        except torch.OutOfMemoryError as exc:
            # drop what was allocated
            oom, logits, loss = str(exc) or "CUDA out of memory", None, None
        if oom:
            self.free_cached_memory()
        # One tiny all-reduce per step, over the CPU: did any rank run out of memory, was a stop
        # asked? Both are known to the host, so the host never waits for the device here.
        stop, failed = agree_host(bool(oom), self.hooks.stop_code())
        if failed:
            raise StepOOM(failed, oom, where="forward")
        self.phase = "backward"
        if self.hooks.injector is not None:  # backward's start: the peers go on into the all-reduce
            logits.register_hook(lambda grad: self.inject("backward"))
        self.scaler.scale(loss).backward()
        # fault injection: a slower network
        if self.hooks.sync_delay is not None and self.ddp.require_backward_grad_sync:
            time.sleep(self.hooks.sync_delay(self.steps_done))
        # AGS and its Δ(G) see unscaled gradients (no-op unless fp16)
        self.scaler.unscale_(self.opt)
        refresh = self.walk.refreshes_next
        self.walk.refreshing(refresh)
        if refresh:
            self._refresh(x, y)
        self.phase = "forward"
        # skipped (no Δ sample, no AGS step) when fp16 gradients overflowed
        self.scaler.step(self.opt)
        self.scaler.update()
        n = len(y)
        sums = torch.stack([loss.detach().double() * n, self.metric_sum(logits.detach(), y)])
        self.walk.stepped(chunk, loss.detach(), sums, n)
        self.sched.step()
        return stop

    def _refresh(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """AGS's refresh inside the step: the scale factors measured again at the reference
        sub-batch (:func:`tula.runtime.refresh.refresh_scales`), and the pair of squared norms
        kept for the epoch's gradient noise scale."""
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        self.phase = "refresh"
        try:
            done = refresh_scales(
                self.ddp,
                self.opt,
                self.loss_fn,
                x[: self.small_local],
                y[: self.small_local],
                autocast=self.autocast,
                loss_scale=scale,
            )
        except StepOOM:
            self.free_cached_memory()
            raise
        self.walk.refresh_next(not done)  # a non-finite gradient: try again at the next step
        # |G_small|^2 at AGS's reference sub-batch and |G_B|^2: the epoch's noise scale
        if done:
            self.noise_pairs.append(self.opt.last_sq_norms)

    def set_global_batch(self, global_batch: int, park: bool = False, back: bool = False) -> None:
        """Run the next steps at another global batch (the same model, optimizer and step), from
        the start of an epoch, or where that batch was left if it was parked. ``park``: keep
        this batch's loader and place for a later return (the sweep's rounds); ``back``: the
        return itself, the other batches' parked loaders let go."""
        self.walk.moved_to(self.stream.switch(global_batch, self.walk.pos, park))
        if back:
            self.stream.forget_parked()
        self.walk.at_batch(global_batch)
        self.steps_per_epoch = steps_per_epoch(self.data.train_size, global_batch, self.world)

    def forget_feed(self) -> None:
        """The feed was read elsewhere (a memory step, the input timed alone): the next step
        starts a fresh pass where training stands."""
        self.stream.forget()

    def no_sync(self) -> contextlib.AbstractContextManager:
        """Steps without the gradient all-reduce (compute-only: DDP's ``no_sync``)."""
        return self.ddp.no_sync()

    def evaluate(self) -> tuple[float, float]:
        """(test loss, test accuracy) over the whole test set, sharded over the ranks
        (:class:`tula.runtime.evaluation.Evaluator`: an OOM anywhere halves the batch)."""
        return self.evaluator.evaluate(self, self.steps_done)

    # -- state changed from outside only through these ----------------------------------
    def refresh_next(self, due: bool = True) -> None:
        """The next step refreshes AGS's factors (a timed or measured refresh step)."""
        self.walk.refresh_next(due)

    def gradient_norms(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        """(|G_b|^2 averaged over the workers, |G_B|^2 of their all-reduced mean) on this rank's
        share of one global batch, at the current weights: forward and backward under
        ``no_sync`` (each worker's own gradient), then one all-reduce of the gradient with
        the worker's squared norm riding along. No optimizer step; the gradients are cleared
        (:mod:`tula.runtime.gradnoise` estimates the gradient noise scale from these)."""
        x, y = self.to_device(x, y)
        self.opt.zero_grad(set_to_none=True)
        with self.ddp.no_sync():
            _, loss = self.forward_loss(x, y)
            loss.float().backward()
        grads = [p.grad.reshape(-1).float() for p in self.ddp.parameters() if p.grad is not None]
        flat = torch.cat(grads)
        buf = torch.cat([flat, flat.pow(2).sum().view(1)])
        torch_dist.all_reduce(buf)
        buf /= self.world
        self.opt.zero_grad(set_to_none=True)
        return float(buf[-1].item()), float(buf[:-1].pow(2).sum().item())
