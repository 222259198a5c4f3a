"""The one training step (paper §III-C, §IV-B): what the probe, the production job and the
generalization suite all run.

:class:`Replica` is one data-parallel worker: the workload's data, the DDP model and its
autocast, and the :class:`StepHooks` the job gives it, with parts that own the rest of the
step's state: the ``train.method`` optimizer, its LR schedule, the GradScaler and AGS's noise
pairs (``update``, :class:`tula.runtime.step.update.Update`); where training stands, the epoch's
sums and the kind of the next step (``walk``, :class:`tula.runtime.step.epoch_walk.EpochWalk`);
the batches (``stream``) and evaluation (``evaluator``); others change it only through them.
:meth:`Replica.step`: (k - 1 accumulated micro-batches' forward and backward under ``no_sync``)
-> forward under autocast -> one all-reduce of (OOM, stop) flags -> backward (DDP's bucketed
all-reduce) -> unscale -> AGS refresh when due -> optimizer step, LR schedule -> sums.

Out of memory is agreed on wherever a collective follows that every rank makes anyway (the
step's flags, AGS's refresh all-reduce, evaluation's sums, one all-reduce after a checkpoint)
and raised on every rank as :class:`tula.runtime.group.agreement.StepOOM`; in backward, where the
peers wait inside DDP's all-reduce, the failing rank leaves a record (``oom/``) instead
(:mod:`tula.production.trainer`). The timer times around the walk's steps (compute-only: under
``DDP.no_sync()``); ``spans`` the micro-batches' part of each, while the probe asks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Iterator

import torch
import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tula import checkpoint, model_inputs
from tula import config as config_mod
from tula.model.grid import micro_steps, steps_per_epoch
from tula.runtime.group.agreement import StepOOM, agree_host
from tula.runtime.input import data as data_mod
from tula.runtime.input import loader
from tula.runtime.step.epoch_walk import EpochWalk
from tula.runtime.step.evaluation import Evaluator
from tula.runtime.step.nets import build_model, compiled
from tula.runtime.step.stepstate import Position, StepHooks
from tula.runtime.step.stream import Stream
from tula.runtime.step.update import Update
from tula.runtime.timer.clocks import Spans, clock_for
from tula.runtime.timer.timing import StepTimer
from tula.runtime.train import recipe
from tula.runtime.train.loss_metric import EpochMetric, build_loss, build_metric
from tula.runtime.train.methods import Cadence, build_method, set_post_local_iter

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Replica:
    """One worker's model and data, and the training step, of parts that each own their
    state (the module's text). What a checkpoint holds of it is theirs put together
    (:meth:`state_dict`, :meth:`load_state_dict`, :meth:`undone`). ``data``: the workload's
    sets loaded already in this process (a probe job's later points)."""

    def __init__(
        self,
        cfg: config_mod.Config,
        device: torch.device,
        global_batch: int,
        rank: int,
        world: int,
        hooks: StepHooks | None = None,
        data: data_mod.WorkloadData | None = None,
        max_micro_batch: int | None = None,
    ):
        t = cfg.train
        self.device, self.rank, self.world = device, rank, world
        self.data = data if data is not None else data_mod.load_config(cfg)
        torch.manual_seed(cfg.workload.seed)  # same initial weights on every rank
        model = build_model(cfg.workload.model, self.data.input_shape, self.data.num_classes)
        self.channels_last = t.channels_last and len(self.data.input_shape) == 3
        layout = torch.channels_last if self.channels_last else torch.preserve_format
        model = model.to(device, memory_format=layout)
        self.ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        # what the step's forward calls (train.compile, as the probe's record says it)
        self.net, self.compile = compiled(self.ddp) if t.compile == "on" else self.ddp, t.compile
        self.steps_per_epoch = steps_per_epoch(self.data.train_size, global_batch, self.world)
        opt, prepare_ddp = build_method(
            t.method, t, self.ddp.module, global_batch, self.steps_per_epoch
        )
        prepare_ddp(self.ddp)
        # what of train.method the step, the epoch's walk, the monitor and the checkpoint ask
        self.cadence = Cadence.of(t)
        # the optimizer, its LR schedule (warm-up, then train.schedule) over the run's epochs
        # at this batch, the GradScaler (fp16) and AGS's noise pairs
        self.update = Update(
            opt,
            model_inputs.lr_plan(t),
            cfg.workload.epochs,
            (global_batch, self.steps_per_epoch),
            t.precision == "fp16",
            device,
            t.grad_clip_norm,
            recipe.build_ema(t, self.ddp.module),
        )
        self.autocast_dtype = AUTOCAST_DTYPES[t.precision]
        self.loss_fn, self.metric_sum = build_loss(t), build_metric(t, device)
        self.eval_metric = build_metric(t, device)  # evaluation's own (torchmetrics)
        self.small_local = max(1, t.ags_small_batch // world)
        self.accumulate, self.max_micro_batch = t.accumulate, max_micro_batch  # micro_steps
        self.phase = "forward"  # where in the step (or evaluation): forward, backward, refresh
        self.hooks = dataclasses.replace(hooks or StepHooks(), injector=None)
        self.inject_faults((hooks or StepHooks()).injector)
        loaders = loader.Loaders(cfg, self.data, rank, world, device)  # data.*, decided once
        self.evaluator = Evaluator(loaders)
        self.stream = Stream(loaders, global_batch, self.channels_last)
        # the device's clock (events on CUDA, the host's elsewhere): one-off steps timed alone
        self.timer = StepTimer(clock_for(device, self.sync_device))
        self.spans = Spans(self.timer.clock)  # each micro-batch's part, while the probe asks
        batches = (global_batch, world)
        over_epoch = self.metric_sum if isinstance(self.metric_sum, EpochMetric) else None
        self.walk = EpochWalk(
            self.data, self.stream, self.timer, self.cadence, batches, self.step, device, over_epoch
        )

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

    # -- pieces of the step ------------------------------------------------------------
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
        are inside DDP's gradient all-reduce): it propagates, and :class:`Trainer` records it.
        Accumulated (train.accumulate: k > 1 micro-batches, :func:`micro_steps`), the first k - 1
        each run their forward and backward under ``no_sync`` first (an OOM there is agreed on
        too)."""
        chunk = self.walk.next_chunk()
        self.update.clear_gradients()
        oom, self.phase, n, whole, parts = "", "forward", len(y), (x, y), []
        k = min(micro_steps(n, self.accumulate, self.max_micro_batch), n)
        xs, ys = torch.tensor_split(x, k), torch.tensor_split(y, k)
        try:
            # each micro-batch's loss weighted by its share of the batch: their gradients sum
            # to the batch's mean gradient; the last backward is the step's synced one
            with self.no_sync() if len(xs) > 1 else contextlib.nullcontext():
                parts = [self._micro_step(*b, len(b[1]) / n) for b in zip(xs[:-1], ys[:-1])]
            with self.spans.span():
                x, y = self.to_device(xs[-1], ys[-1])
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
        with self.spans.span():
            self.update.backward(loss * (len(y) / n) if len(xs) > 1 else loss)
        # fault injection: a slower network
        if self.hooks.sync_delay is not None and self.ddp.require_backward_grad_sync:
            time.sleep(self.hooks.sync_delay(self.steps_done))
        # AGS and its Δ(G) see unscaled gradients (no-op unless fp16)
        self.update.unscale()
        refresh = self.walk.refreshes_next
        self.walk.refreshing(refresh)
        if refresh:  # at AGS's reference sub-batch: the first samples of this rank's batch
            k, self.phase = self.small_local, "refresh"
            small = (x[:k], y[:k]) if len(xs) == 1 else self.to_device(whole[0][:k], whole[1][:k])
            try:
                done = self.update.refresh(self.ddp, self.loss_fn, *small, self.autocast)
            except StepOOM:
                self.free_cached_memory()
                raise
            self.walk.refresh_next(not done)  # a non-finite gradient: again at the next step
        self.phase = "forward"
        self.update.apply()  # the optimizer's step, then the LR schedule's
        sums = sum(parts, self._sums(loss, logits, y))
        self.walk.stepped(chunk, loss.detach() if len(xs) == 1 else sums[0] / n, sums, n)
        return stop

    def _micro_step(self, x: torch.Tensor, y: torch.Tensor, share: float) -> torch.Tensor:
        """An accumulated step's micro-batch but its last (under ``no_sync``): its loss's
        gradient times ``share``, its part of the batch; returns its (loss, metric) sums."""
        with self.spans.span():
            x, y = self.to_device(x, y)
            logits, loss = self.forward_loss(x, y)
            self.update.backward(loss * share)
        return self._sums(loss, logits, y)

    def _sums(self, loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.stack([loss.detach().double() * len(y), self.metric_sum(logits.detach(), y)])

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

    def evaluate(self, ema: bool = False) -> tuple[float, float]:
        """(test loss, test metric) over the whole test set, sharded over the ranks
        (:class:`tula.runtime.step.evaluation.Evaluator`: an OOM anywhere halves the batch), of
        the weights or (``ema``) of their moving average."""
        net = self.update.ema.module if ema and self.update.ema else None
        return self.evaluator.evaluate(self, self.steps_done, net)

    # -- state changed from outside only through these ----------------------------------
    def refresh_next(self, due: bool = True) -> None:
        """The next step refreshes AGS's factors (a timed or measured refresh step)."""
        self.walk.refresh_next(due)

    # -- what a checkpoint holds of it: its parts' own states ----------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds of this replica (besides each rank's RNG state and sums)."""
        return {
            "model": self.ddp.module.state_dict(),
            **self.update.state_dict(),  # "optimizer", "ags", "scheduler", "scaler", "noise_pairs"
            "position": self.walk.pos.state_dict(),
            "evaluation": self.evaluator.state_dict(),
        }

    def load_state_dict(
        self,
        state: dict[str, Any],
        stats: torch.Tensor,
        own: dict[str, Any] | None = None,
        metric: list | None = None,
    ) -> None:
        """This replica as the checkpoint ``state`` holds it, each part put back by its owner,
        with this rank's partial-epoch sums ``stats``; ``own``: this rank's own model and
        optimizer parts (post-local SGD between two averages). A checkpoint written at another
        global batch (a relaunch at a smaller B) is followed by the optimizer and the schedule
        (:meth:`Update.follow`)."""
        self.ddp.module.load_state_dict(state["model"])
        written_at = state.get("global_batch", self.global_batch)
        self.update.load_state_dict(state, same_batch=written_at == self.global_batch)
        self.evaluator.load_state_dict(state["evaluation"])
        self.walk.moved_to(Position.from_state_dict(state["position"]), stats, metric)
        set_post_local_iter(self.ddp, self.steps_done)
        if own is not None:
            self.ddp.module.load_state_dict(own["model"])
            self.update.load_own(own)
        if written_at != self.global_batch:
            batches = (self.global_batch, self.steps_per_epoch)
            self.walk.refresh_next(
                self.update.follow(written_at, batches, self.epochs_done, self.rank)
            )

    def take_weights_of_rank0(self) -> None:
        """Rank 0's weights on every rank (compute-only steps stepped each replica on its own
        gradient: the gradient noise scale is measured at one point)."""
        with torch.no_grad():
            for t in self.ddp.module.state_dict().values():
                torch_dist.broadcast(t, src=0)

    @contextlib.contextmanager
    def undone(self) -> Iterator[None]:
        """Run steps, then put back exactly everything a step changes (model, optimizer,
        schedule, scaler, noise pairs, position, sums, RNG and the step's flags): the
        monitor's compute-only step. Copies go to host memory: no extra device memory."""
        model = {
            k: v.detach().to("cpu", copy=True) for k, v in self.ddp.module.state_dict().items()
        }
        updated, walked, rng = self.update.saved(), self.walk.saved(), checkpoint.rng_state()
        # DDP broadcasts rank 0's buffers (batch-norm statistics) before a forward only if the
        # step before synced its gradients: a no_sync step turns that off for the next one
        forward_sync = self.ddp.require_forward_param_sync
        yield
        self.ddp.module.load_state_dict(model)
        self.update.put_back(updated)
        checkpoint.set_rng_state(rng)
        self.walk.put_back(walked)
        self.ddp.require_forward_param_sync = forward_sync
