"""The one training step, and the small trainer around it (paper §III-C, §IV-B).

:class:`Replica` is one data-parallel worker: the workload's data and DataLoader, the DDP
model, the ``train.method`` optimizer, its LR schedule, the mixed-precision autocast and
GradScaler, and where training stands (:class:`Position`). :meth:`Replica.step` is the
training step that the probe (``tula probe``), the production job (``tula launch``) and the
generalization suite (``tula compare``) all run:

    forward under autocast -> one all-reduce of (OOM, stop) flags that every rank agrees on
    -> backward (DDP's bucketed gradient all-reduce) -> unscale -> AGS refresh when due
    -> optimizer step through the GradScaler -> LR schedule -> loss/accuracy sums on device.

Out of memory is agreed on wherever a collective follows that every rank makes anyway (the
step's flags, AGS's refresh all-reduce, evaluation's sums, one all-reduce after a
checkpoint) and raised on every rank as :class:`tula.dist.StepOOM`; in backward, where the
peers wait inside DDP's all-reduce, the failing rank leaves a record (``oom/``) instead.

:meth:`Replica.timed_step` times one step from fetching its batch to the end of the step
(device synchronised), the way the probe and the production job both time it. The probe's
compute-only steps are the same call under ``DDP.no_sync()``.

:class:`Trainer` is the production loop in named phases: restore, step, end of epoch,
checkpoint, finish.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd
import torch
import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tula import checkpoint, dist
from tula.checkpoint import Checkpointing
from tula.dist import StepOOM, oom_place
from tula import config as config_mod
from tula import data as data_mod
from tula import faults as tula_faults
from tula.config import TrainSettings
from tula.io import read_json, write_bytes, write_csv, write_json
from tula.models import build_model
from tula.optim import TulaOptimizer, build_method, lr_factor, refresh_scales
from tula.progress import Progress, fmt_duration

METRIC_COLUMNS = [
    "epoch", "step", "lr", "train_loss", "train_acc", "test_loss", "test_acc", "epoch_time_s", "samples_per_s",
    "grad_noise_scale", "grad_sq", "grad_trace",
]  # fmt: skip

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

steps_per_epoch = data_mod.steps_per_epoch


def refresh_due(t: TrainSettings, epoch_start: bool, global_step: int) -> bool:
    """AGS refreshes its factors on the first step of each epoch, or every k steps."""
    if t.method != "ags":
        return False
    k = t.ags_refresh_every_steps
    return global_step % k == 0 if k else epoch_start


@dataclass
class Position:
    """Where training stands: optimizer steps taken, the epoch in progress (1-based) and how
    many samples of that epoch's permutation are consumed. Independent of the batch size, so
    a relaunch at a smaller batch continues with the next unseen sample."""

    step: int = 0
    epoch: int = 1
    offset: int = 0

    def epochs_done(self, train_samples: int) -> float:
        return (self.epoch - 1) + min(self.offset, train_samples) / train_samples


class StopSignals:
    """SIGTERM / SIGUSR2 set a flag; the training loop acts on it at the next step boundary
    once every rank agrees, so a checkpoint is never taken in the middle of a step.

    USR2 is what SLURM sends before the time limit or on preemption (``--signal=USR2@...``,
    set by submitit); after the checkpoint submitit's own handler requeues the job. TERM is
    scancel, ``scontrol requeue`` or a preemption without grace: checkpoint, then exit.
    """

    CODES = {signal.SIGTERM: 1, signal.SIGINT: 1, signal.SIGUSR2: 2}  # SIGINT: Ctrl-C on a local run

    def __init__(self) -> None:
        self.code, self.name = 0, ""
        self.previous = {sig: signal.getsignal(sig) for sig in self.CODES}
        for sig in self.CODES:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        sig = signal.Signals(signum)
        if self.CODES[sig] >= self.code:
            self.code, self.name = self.CODES[sig], sig.name

    def requeue_handler(self):
        """submitit's checkpoint-and-requeue handler, when running under submitit."""
        h = self.previous[signal.SIGUSR2]
        return h if callable(h) and type(getattr(h, "__self__", None)).__name__ == "SignalHandler" else None


def _record_segment(out_dir: Path, seg: dict[str, Any]) -> None:
    """Append this run's segment (start/end step, outcome) to segments.json (rank 0)."""
    path = out_dir / "segments.json"
    segs = read_json(path) if path.exists() else []
    write_json(path, [*segs, seg])


def oom_marker(out_dir: Path, attempt: int, rank: int) -> Path:
    return out_dir / "oom" / f"attempt{attempt}-rank{rank}.json"


class Replica:
    """One worker's model, optimizer, data and position, and the training step."""

    def __init__(self, cfg: config_mod.Config, device: torch.device, global_batch: int, rank: int, world: int):
        t = cfg.train
        self.cfg, self.t, self.device, self.global_batch, self.rank, self.world = cfg, t, device, global_batch, rank, world
        self.data = data_mod.load_config(cfg)
        torch.manual_seed(cfg.workload.seed)  # same initial weights on every rank
        model = build_model(cfg.workload.model, self.data.input_shape, self.data.num_classes)
        self.channels_last = t.channels_last and len(self.data.input_shape) == 3
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        model = model.to(device)
        self.ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        self.steps_per_epoch = steps_per_epoch(self.data.train_size, global_batch)
        self.opt, prepare_ddp = build_method(t.method, t, list(self.ddp.parameters()), global_batch, self.steps_per_epoch)
        prepare_ddp(self.ddp)
        self.pos = Position()
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda _: self._lr_factor())
        self.autocast_dtype = AUTOCAST_DTYPES[t.precision]
        self.scaler = torch.amp.GradScaler(device.type, enabled=t.precision == "fp16")
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.small_local = max(1, t.ags_small_batch // world)
        self.stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss*n, correct, n of this epoch
        self.force_refresh = False
        self.refreshed = False  # did the last step refresh AGS's factors?
        self.last_chunk = 0  # samples (all ranks) of the last step's batch
        self.stop_code: Callable[[], int] = lambda: 0  # production: the agreed stop signal
        self.phase = "forward"  # where in the step (or evaluation) this rank is: forward, backward, refresh, eval
        self.inject: Callable[[str], None] | None = None  # fault injection (tula.faults), production only
        self.eval_batch = cfg.data.eval_batch_size  # per worker; halved after an out-of-memory in evaluation
        self.eval_retries: list[dict[str, Any]] = []
        self.noise_pairs: list[tuple[float, float]] = []  # this epoch's AGS refreshes: (|G_small|^2, |G_B|^2)
        self.loader, self.sampler = data_mod.train_loader(cfg, self.data, global_batch, rank, world, device)
        self._eval_loader = None
        self._batches: Iterator | None = None  # next_timed_step's iterator over this epoch

    # -- pieces of the step ------------------------------------------------------------
    def _lr_factor(self) -> float:  # LR multiplier at the current position (epochs done, any batch)
        t = self.t
        return lr_factor(t.method, self.pos.epochs_done(self.data.train_size) * self.steps_per_epoch,
                         self.steps_per_epoch, self.global_batch, t.base_batch, t.warmup_epochs,
                         t.lr_decay_epochs, t.lr_decay_factor)  # fmt: skip

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def to_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.to(self.device, non_blocking=True)
        if self.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y.to(self.device, non_blocking=True)

    def forward_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, loss) under the configured precision; x, y already on the device."""
        with self.autocast():
            logits = self.ddp(x)
            return logits, self.loss_fn(logits, y)

    def sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def free_cached_memory(self) -> None:
        """After an out-of-memory error: give the allocator's cached blocks back."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def inject_faults(self, inject: Callable[[str], None]) -> None:
        """Call ``inject(place)`` where an out-of-memory error can happen: inside the model's
        forward (training, AGS refresh, evaluation: the phase says which), at the start of
        backward, and (Trainer) while checkpointing."""
        self.inject = inject
        self.ddp.module.register_forward_pre_hook(lambda m, a: inject(self.phase))

    # -- the step ----------------------------------------------------------------------
    def step(self, x: torch.Tensor, y: torch.Tensor) -> int:
        """One training step on this rank's share of the next global batch. Returns the stop
        code every rank agreed on (0: go on); raises :class:`StepOOM` on every rank together
        when any rank ran out of memory moving the batch to the device, in the forward pass or
        in AGS's refresh. An out-of-memory error in backward cannot be agreed on (the peers
        are inside DDP's gradient all-reduce): it propagates, and :class:`Trainer` records it."""
        chunk = data_mod.next_chunk(self.data.train_size, self.global_batch, self.pos.offset, self.world)
        self.opt.zero_grad(set_to_none=True)
        oom, self.phase = "", "forward"
        try:
            x, y = self.to_device(x, y)
            logits, loss = self.forward_loss(x, y)
        except torch.OutOfMemoryError as exc:
            oom, logits, loss = str(exc) or "CUDA out of memory", None, None  # drop what was allocated
        if oom:
            self.free_cached_memory()
        # One tiny all-reduce per step: did any rank run out of memory, was a stop asked?
        flags = torch.zeros(self.world + 1, device=self.device)
        flags[self.rank], flags[self.world] = float(bool(oom)), float(self.stop_code())
        torch_dist.all_reduce(flags, op=torch_dist.ReduceOp.MAX)
        if flags[: self.world].any():
            raise StepOOM([r for r in range(self.world) if flags[r] > 0], oom, where="forward")
        self.phase = "backward"
        if self.inject is not None:  # the start of backward: the peers go on into DDP's all-reduce
            logits.register_hook(lambda grad: self.inject("backward"))
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.opt)  # AGS and its Δ(G) see unscaled gradients (no-op unless fp16)
        self.refreshed = self.force_refresh or refresh_due(self.t, self.pos.offset == 0, self.pos.step)
        if self.refreshed:
            scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
            self.phase = "refresh"
            try:
                done = refresh_scales(self.ddp, self.opt, self.loss_fn, x[: self.small_local],
                                      y[: self.small_local], autocast=self.autocast, loss_scale=scale)  # fmt: skip
            except StepOOM:
                self.free_cached_memory()
                raise
            self.force_refresh = not done  # a non-finite gradient: try again at the next step
            if done:  # |G_small|^2 at AGS's reference sub-batch and |G_B|^2: the epoch's noise scale
                self.noise_pairs.append(self.opt.last_sq_norms)
        self.phase = "forward"
        self.scaler.step(self.opt)  # skipped (no Δ sample, no AGS step) when fp16 gradients overflowed
        self.scaler.update()
        self.pos.step += 1
        self.pos.offset += chunk
        self.last_chunk = chunk
        self.sched.step()
        n = torch.tensor(float(len(y)), dtype=torch.float64, device=self.device)
        self.stats += torch.stack([loss.detach().double() * n, (logits.argmax(1) == y).sum().double(), n])
        return int(flags[self.world].item())

    def gradient_norms(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        """(|G_b|^2 averaged over the workers, |G_B|^2 of their all-reduced mean) on this rank's
        share of one global batch, at the current weights: forward and backward under
        ``no_sync`` (each worker's own gradient), then one all-reduce of the gradient with
        the worker's squared norm riding along. No optimizer step; the gradients are
        cleared. The gradient noise scale is estimated from these (tula.noise)."""
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

    def set_global_batch(self, global_batch: int) -> None:
        """Run the next steps at another global batch (the same model, optimizer and step):
        a new loader cut into batches of ``global_batch``, from the start of an epoch. The
        probe's compute sweep and the memory probe time and measure other local batches so."""
        self.global_batch = global_batch
        self.steps_per_epoch = steps_per_epoch(self.data.train_size, global_batch)
        self.loader, self.sampler = data_mod.train_loader(self.cfg, self.data, global_batch, self.rank, self.world,
                                                          self.device)  # fmt: skip
        self.pos = Position(self.pos.step, self.pos.epoch, 0)
        self.stats.zero_()
        self._batches = None

    def replicas_differ(self) -> bool:
        """Can the ranks' models and optimizer states differ? Post-local SGD's local phase:
        each rank steps on its own gradient between two averages, so a checkpoint keeps every
        rank's model and optimizer state, not only rank 0's."""
        return self.t.method == "polo"

    def midepoch_refreshes_per_step(self) -> float:
        """How often training refreshes AGS's factors other than at an epoch's first step
        (``ags_refresh_every_steps: k``: every k steps; by default only at epoch starts)."""
        k = self.t.ags_refresh_every_steps
        return 1.0 / k if self.t.method == "ags" and k else 0.0

    def epoch_batches(self) -> Iterator:
        """This rank's batches from the current position to the end of the epoch."""
        self.sampler.set_position(self.pos.epoch, self.pos.offset)
        return iter(self.loader)

    def next_timed_step(self) -> tuple[float, str]:
        """Time the next training step wherever training stands, closing an epoch (untimed, as
        training does) when it runs out. Returns (seconds, kind); kind is "start" (an epoch's
        first step), "refresh" (a mid-epoch AGS refresh), "partial" (an epoch's short last
        batch) or "plain"."""
        while True:
            if self._batches is None:
                self._batches = self.epoch_batches()
            start = self.pos.offset == 0
            got = self.timed_step(self._batches)
            if got is not None:
                short = self.last_chunk < self.global_batch
                return got[0], "start" if start else "refresh" if self.refreshed else "partial" if short else "plain"
            self.restart_epoch()

    def restart_epoch(self) -> None:
        """Close the epoch in progress; the next step starts a new one."""
        self.end_epoch()
        self._batches = None

    def timed_step(self, batches: Iterator) -> tuple[float, int] | None:
        """Fetch the next batch and run :meth:`step`; (seconds from fetch to the end of the
        step, stop code), or None when the epoch has no batch left."""
        t0 = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            return None
        stop = self.step(*batch)
        self.sync_device()
        return time.perf_counter() - t0, stop

    def epoch_noise(self) -> dict[str, float | None]:
        """The gradient noise scale of the epoch from AGS's refreshes (McCandlish et al.;
        tula.noise): the reference sub-batch's gradient against the step's, both all-reduced,
        so every rank holds the same numbers. Usually one refresh an epoch, so one noisy
        pair; None where there was none (other methods) or |G|^2 came out <= 0."""
        pairs, self.noise_pairs = self.noise_pairs, []
        small = self.small_local * self.world
        if not pairs or not small < self.global_batch:
            return {"grad_noise_scale": None, "grad_sq": None, "grad_trace": None}
        from tula import noise

        est = noise.estimate([p[0] for p in pairs], [p[1] for p in pairs], small, self.global_batch,
                             population=self.data.train_size)  # fmt: skip
        return {"grad_noise_scale": est.b_noise, "grad_sq": est.grad_sq, "grad_trace": est.trace}

    def end_epoch(self) -> tuple[float, float, int]:
        """Close the epoch: (train loss, train accuracy, samples) over every rank; the next starts."""
        torch_dist.all_reduce(self.stats)
        samples = int(self.stats[2].item())
        loss, acc = (self.stats[:2] / max(samples, 1)).tolist()
        self.stats.zero_()
        self.pos.epoch, self.pos.offset = self.pos.epoch + 1, 0
        return loss, acc, samples

    def evaluate(self) -> tuple[float, float]:
        """(test loss, test accuracy) over the whole test set, sharded over the ranks.

        Out of memory on any rank: the ranks learn it from the one all-reduce of the sums
        (a flag per rank rides along) and evaluate again at half the evaluation batch, down
        to one sample per worker; below that, :class:`StepOOM` (``where="eval"``)."""
        while True:
            if self._eval_loader is None:
                self._eval_loader = data_mod.eval_loader(self.cfg, self.data, self.rank, self.world, self.device,
                                                         batch_size=self.eval_batch)  # fmt: skip
            t0, oom = time.perf_counter(), ""
            sums = torch.zeros(3 + self.world, dtype=torch.float64, device=self.device)  # loss, correct, count, OOM
            self.ddp.eval()
            self.phase = "eval"
            try:
                with torch.no_grad():
                    for x, y in self._eval_loader:
                        x, y = self.to_device(x, y)
                        with self.autocast():
                            logits = self.ddp.module(x)
                        sums[0] += torch.nn.functional.cross_entropy(logits.float(), y, reduction="sum").double()
                        sums[1] += (logits.argmax(1) == y).sum().double()
                        sums[2] += len(y)
            except torch.OutOfMemoryError as exc:
                oom = str(exc) or "out of memory"
            finally:
                self.ddp.train()
                self.phase = "forward"
            if oom:
                self.free_cached_memory()
            sums[3 + self.rank] = float(bool(oom))
            torch_dist.all_reduce(sums)
            failed = [r for r in range(self.world) if sums[3 + r] > 0]
            if not failed:
                n = max(sums[2].item(), 1.0)
                return sums[0].item() / n, sums[1].item() / n
            if self.eval_batch == 1:
                raise StepOOM(failed, oom, where="eval")
            smaller = self.eval_batch // 2
            self.eval_retries.append({"step": self.pos.step, "eval_batch": self.eval_batch, "retry_batch": smaller,
                                      "ranks": failed, "seconds_lost": time.perf_counter() - t0})  # fmt: skip
            if self.rank == 0:
                print(f"[train] out of memory in evaluation on rank(s) {failed} at {self.eval_batch} samples per "
                      f"worker: evaluating again at {smaller}", flush=True)  # fmt: skip
            self.eval_batch, self._eval_loader = smaller, None

    # -- state -------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"model": self.ddp.module.state_dict(), "optimizer": self.opt.state_dict(),
                "scheduler": self.sched.state_dict(), "scaler": self.scaler.state_dict(), "epoch": self.pos.epoch,
                "offset": self.pos.offset, "eval_batch": self.eval_batch, "eval_retries": self.eval_retries,
                "noise_pairs": list(self.noise_pairs)}  # fmt: skip

    def load_state(self, state: dict[str, Any], step: int) -> None:
        self.ddp.module.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.eval_batch = min(self.eval_batch, state.get("eval_batch", self.eval_batch))  # learnt: keep it
        self.eval_retries = list(state.get("eval_retries", []))
        self.noise_pairs = [tuple(p) for p in state.get("noise_pairs", [])]
        self.pos = Position(step, state["epoch"], state["offset"])
        set_post_local_iter(self.ddp, step)




def _process_started() -> float:
    """When this process started (epoch seconds): start-up is counted from there."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable: count from import
        return _IMPORTED


_IMPORTED = time.time()


class Trainer:
    """The production run of one worker in named phases: :meth:`restore`, :meth:`train_epoch`
    (steps), :meth:`end_of_epoch`, :meth:`checkpoint`, :meth:`finish`."""

    def __init__(self, cfg: config_mod.Config, nodes: int, global_batch: int, out_dir: Path,
                 ckpt: Checkpointing | None = None):  # fmt: skip
        self.wenv, self.device, self.backend = dist.init(cfg.hardware)
        if self.wenv.world_size != nodes:
            raise RuntimeError(f"launched {self.wenv.world_size} workers for training at N={nodes}")
        self.cfg, self.nodes, self.global_batch, self.out, self.ckpt = cfg, nodes, global_batch, out_dir, ckpt
        self.rank, self.attempt = self.wenv.rank, ckpt.attempt if ckpt else 1
        self.faults = tula_faults.from_env()
        self.stops = StopSignals() if ckpt else None
        self.r = Replica(cfg, self.device, global_batch, self.rank, nodes)
        if self.stops:
            self.r.stop_code = lambda: self.stops.code
        self.fired: set[tula_faults.Fault] = set()  # injected faults that went off in this process
        if any(f.kind == "oom" for f in self.faults):
            self.r.inject_faults(lambda where: tula_faults.maybe_oom(self.faults, where, self.r.pos.step, self.rank,
                                                                     self.global_batch, self.fired))  # fmt: skip
        # time spent, carried across requeues: steps only / evaluation / checkpoints / process start-ups
        self.times = {"train_time_s": 0.0, "eval_time_s": 0.0, "checkpoint_time_s": 0.0, "startup_time_s": 0.0}
        self.rows: list[dict[str, Any]] = []
        self.epoch_time = 0.0
        self.resumed_from = 0
        self.label = f"train N={nodes} B={global_batch}"
        self.seg: dict[str, Any] = {}

    # -- phases ------------------------------------------------------------------------
    def restore(self) -> None:
        """Continue from the newest usable checkpoint of this run, if there is one."""
        if not self.ckpt:
            return
        state = _load_checkpoint(self.ckpt, self.rank)
        if not state:
            return
        r = self.r
        r.load_state(state, state["step"])
        own = state["ranks"][self.rank].get("replica")
        if own is not None:  # post-local SGD between two averages: this rank's own model and momentum
            r.ddp.module.load_state_dict(own["model"])
            r.opt.load_state_dict(own["optimizer"])
        checkpoint.set_rng_state(state["ranks"][self.rank]["rng"])
        r.stats = state["ranks"][self.rank]["epoch_stats"].to(self.device)
        self.rows, self.epoch_time = state["rows"], state["epoch_time_s"]
        self.times.update({k: state.get(k, 0.0) for k in self.times})
        self.resumed_from = r.pos.step
        if state["global_batch"] != self.global_batch:
            r.noise_pairs = []  # measured at the old B
            r.force_refresh = _follow_new_batch(r.opt, r.sched, state["global_batch"], self.global_batch, self.rank)
        if self.rank == 0:
            print(f"[{self.label}] resumed from the checkpoint of step {r.pos.step} (epoch {r.pos.epoch}, "
                  f"{r.pos.offset}/{r.data.train_size} samples; written at B={state['global_batch']})", flush=True)  # fmt: skip

    def train_epoch(self) -> None:
        """Steps until the epoch's data is used up (or a stop is agreed on)."""
        r = self.r
        batches = r.epoch_batches()
        while True:
            tula_faults.maybe_signal(self.faults, r.pos.step, self.rank, self.resumed_from)
            if self.first_step_at is None:
                self.first_step_at = time.time()
                self.times["startup_time_s"] += self.first_step_at - self.process_started
                self.seg["first_step_time"] = self.first_step_at  # fault drills: time to resumed training
            timed = r.timed_step(batches)
            if timed is None:
                return
            dt, stop = timed
            self.epoch_time += dt
            self.times["train_time_s"] += dt
            every = self.ckpt.every_steps if self.ckpt else None
            if self.ckpt and (stop or (every and r.pos.step % every == 0)):
                self.checkpoint()
            if stop:
                _stop(stop, self.stops, self.seg, r.pos, self.out, self.rank, self.label)

    def end_of_epoch(self, epochs: int, progress: Progress) -> None:
        r = self.r
        train_loss, train_acc, samples = r.end_epoch()
        t0 = time.perf_counter()
        test_loss, test_acc = r.evaluate()
        self.times["eval_time_s"] += time.perf_counter() - t0
        row = {"epoch": r.pos.epoch - 1, "step": r.pos.step, "lr": r.opt.param_groups[0]["lr"],
               "train_loss": train_loss, "train_acc": train_acc, "test_loss": test_loss, "test_acc": test_acc,
               "epoch_time_s": self.epoch_time, "samples_per_s": samples / max(self.epoch_time, 1e-9),
               **r.epoch_noise()}  # fmt: skip
        self.rows.append(row)
        self.epoch_time = 0.0
        if self.rank == 0:
            write_csv(self.out / "metrics.csv", pd.DataFrame(self.rows, columns=METRIC_COLUMNS))
            progress.update(row["epoch"], "epoch ", extra=f"loss {train_loss:.4f}  test acc {100 * test_acc:.2f}%  "
                            f"{row['samples_per_s']:.0f} samples/s")  # fmt: skip
        every = self.ckpt.every_epochs if self.ckpt else None
        if every and row["epoch"] % every == 0 and r.pos.epoch <= epochs:
            self.checkpoint()

    def checkpoint(self, complete: bool = False) -> None:
        """Every rank's RNG states and partial-epoch sums go to rank 0, which writes the file.

        Out of memory on any rank (device or host) while it gathers its part or while rank 0
        serialises and writes: nothing half-written is left (the writes are atomic and the
        manifest comes last), every rank learns it from one all-reduce after the write, and
        all raise :class:`StepOOM` (``where="checkpoint"``)."""
        t0 = time.perf_counter()
        r = self.r
        err, mine = "", None
        try:
            if r.inject is not None:
                r.inject("checkpoint")
            mine = {"rng": checkpoint.rng_state(), "epoch_stats": r.stats.cpu().clone()}
            if r.replicas_differ() and self.rank != 0:  # rank 0's model and optimizer are the file's own
                mine["replica"] = _to_cpu({"model": r.ddp.module.state_dict(), "optimizer": r.opt.state_dict()})
        except (torch.OutOfMemoryError, MemoryError) as exc:
            err = str(exc) or type(exc).__name__
        per_rank: list[Any] = [None] * self.nodes
        torch_dist.all_gather_object(per_rank, mine)
        if self.rank == 0 and all(p is not None for p in per_rank):
            try:
                state = {**r.state(), "fingerprint": self.ckpt.fingerprint, "global_batch": self.global_batch,
                         "nodes": self.nodes, "complete": complete, "ranks": per_rank, "rows": self.rows,
                         "epoch_time_s": self.epoch_time, **self.times, "method": self.cfg.train.method,
                         "attempt": self.attempt}  # fmt: skip
                hook = checkpoint.truncate if tula_faults.truncate_due(self.faults, r.pos.step) else None
                checkpoint.save(self.ckpt.directory, state, r.pos.step, keep=self.ckpt.keep, after_write=hook)
            except (torch.OutOfMemoryError, MemoryError) as exc:
                err = str(exc) or type(exc).__name__
        failed = torch.zeros(self.nodes, device=self.device)
        failed[self.rank] = float(bool(err))
        torch_dist.all_reduce(failed)
        if failed.any():
            r.free_cached_memory()
            raise StepOOM([i for i in range(self.nodes) if failed[i] > 0], err, where="checkpoint")
        self.times["checkpoint_time_s"] += time.perf_counter() - t0

    def finish(self) -> dict[str, Any]:
        r, t = self.r, self.cfg.train
        if self.ckpt:
            self.checkpoint(complete=True)
        if self.rank == 0:
            steps = max(r.pos.step, 1)
            final = {
                "nodes": self.nodes, "global_batch": self.global_batch, "local_batch": self.global_batch // self.nodes,
                "model": self.cfg.workload.model, "dataset": self.cfg.workload.dataset,
                "optimizer": t.optimizer, "method": t.method, "precision": t.precision,
                "channels_last": r.channels_last, "data_workers": self.cfg.data.num_workers,
                "ags": dict(r.opt.counters) if isinstance(r.opt, TulaOptimizer) else None,
                "fp16_skipped_steps": _skipped(r), "epochs": self.cfg.workload.epochs, "steps": r.pos.step,
                "eval_batch_size": r.eval_batch, "eval_oom_retries": r.eval_retries,
                "train_samples": r.data.train_size, "final_test_acc": self.rows[-1]["test_acc"],
                "best_test_acc": max(x["test_acc"] for x in self.rows),
                "final_train_loss": self.rows[-1]["train_loss"], **self.times,
                "mean_step_time_s": self.times["train_time_s"] / steps,
                "backend": self.backend, "device": str(self.device),
            }  # fmt: skip
            write_bytes(self.out / "model.pt", checkpoint.to_bytes(r.ddp.module.state_dict()))
            write_json(self.out / "final.json", final)
            if self.ckpt:
                _record_segment(self.out, {**self.seg, "end_step": r.pos.step, "outcome": "completed",
                                           "ended": _now(), "reason": "trained every epoch"})  # fmt: skip
            print(f"[{self.label}] done: {fmt_duration(final['train_time_s'])} in {r.pos.step} steps "
                  f"(mean step {1e3 * final['mean_step_time_s']:.2f} ms), evaluation "
                  f"{fmt_duration(final['eval_time_s'])}, checkpoints {fmt_duration(final['checkpoint_time_s'])}; "
                  f"test accuracy {100 * final['final_test_acc']:.2f}% (best {100 * final['best_test_acc']:.2f}%)",
                  flush=True)  # fmt: skip
        dist.shutdown()
        return {"outcome": "completed", "step": r.pos.step}

    # -- the run -----------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train every epoch. Returns ``{"outcome": "completed" | "oom", ...}``; on a stop
        signal it checkpoints and exits (SystemExit) without returning."""
        self.process_started, self.first_step_at = _process_started(), None
        self.restore()
        r, cfg, epochs = self.r, self.cfg, self.cfg.workload.epochs
        if self.rank == 0:
            print(f"[{self.label}] {cfg.workload.model} on {cfg.workload.dataset}: {r.data.train_size} training "
                  f"samples, {r.steps_per_epoch} steps/epoch x {epochs} epochs, method {cfg.train.method}, "
                  f"{cfg.train.precision}, backend {self.backend} on {self.device}, {cfg.data.num_workers} loader "
                  f"worker(s)" + (f", attempt {self.attempt}" if self.ckpt else ""), flush=True)  # fmt: skip
        progress = Progress(self.label, epochs, unit="epoch", every_s=0.0, enabled=self.rank == 0,
                            start=r.pos.epoch - 1)  # fmt: skip
        self.seg = {"attempt": self.attempt, "global_batch": self.global_batch, "start_step": r.pos.step,
                    "host": dist.hostname(), "started": _now(),
                    "job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID")}  # fmt: skip
        try:
            while r.pos.epoch <= epochs:
                self.train_epoch()
                self.end_of_epoch(epochs, progress)
            return self.finish()
        except StepOOM as exc:
            return self._oom(exc)
        except torch.OutOfMemoryError as exc:
            # Where the ranks cannot agree (backward, inside DDP's all-reduce): leave a record for
            # the launcher, which classifies the attempt as out of memory from it, and fail; the
            # peers' collectives end when this process does (gloo at once, NCCL by its watchdog).
            self._oom_record(r.phase, str(exc) or "out of memory")
            raise

    def _oom_record(self, where: str, message: str) -> None:
        write_json(oom_marker(self.out, self.attempt, self.rank), {
            "step": self.r.pos.step, "global_batch": self.global_batch, "where": where, "message": message,
            "time": time.time()})  # fmt: skip

    def _oom(self, exc: StepOOM) -> dict[str, Any]:
        messages: list[Any] = [None] * self.nodes
        torch_dist.all_gather_object(messages, exc.message)
        exc.message = next(messages[r] for r in exc.ranks)
        step = self.r.pos.step
        if self.rank in exc.ranks:
            self._oom_record(exc.where, exc.message)
        what = oom_place(exc.where, step)
        if self.rank == 0:
            print(f"[{self.label}] out of memory {what} on rank(s) {exc.ranks}: {exc.message}", flush=True)
            if self.ckpt:
                _record_segment(self.out, {**self.seg, "end_step": step, "outcome": "oom", "ended": _now(),
                                           "reason": f"out of memory {what} on rank(s) {exc.ranks}: {exc.message}"})  # fmt: skip
        dist.shutdown(ok=True)
        return {"outcome": "oom", "step": step, "ranks": exc.ranks, "message": exc.message, "where": exc.where}


def _to_cpu(obj: Any) -> Any:
    """A copy of a (nested) state dict with every tensor on the CPU, to send to rank 0."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def _skipped(r: Replica) -> int | None:
    """Steps the fp16 GradScaler skipped (overflow), from the optimizer's step counter."""
    if not r.scaler.is_enabled() or not isinstance(r.opt, TulaOptimizer):
        return None
    return r.pos.step - r.opt.counters["steps"]


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _load_checkpoint(ckpt: Checkpointing, rank: int) -> dict[str, Any] | None:
    """Rank 0 picks the newest usable checkpoint of this run; every rank loads that one."""
    chosen: list[Any] = [None]
    if rank == 0:

        def accept(state: dict[str, Any]) -> str:
            if state.get("fingerprint") != ckpt.fingerprint:
                return "written by a run with other settings, N or selected B"
            return "the run it belongs to had finished" if state.get("complete") else ""

        loaded, warnings = checkpoint.load_latest(ckpt.directory, accept)
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr, flush=True)
            print(f"warning: {w}", flush=True)
        chosen[0] = str(loaded.path) if loaded else None
        state = loaded.state if loaded else None
    torch_dist.broadcast_object_list(chosen, src=0)
    if rank != 0 and chosen[0] is not None:
        state = checkpoint.from_bytes(Path(chosen[0]).read_bytes())  # rank 0 verified this file
    return state if chosen[0] is not None else None


def _follow_new_batch(opt, sched, old_batch: int, new_batch: int, rank: int) -> bool:
    """Adapt the restored optimizer to a relaunch at a smaller global batch (paper rules):

    - AGS: s_max = sqrt(B / ags_small_batch) is recomputed for the new B (build_method did);
      the per-parameter factors, ratios measured at the old B, are dropped and re-measured on
      the first step, and the previous gradient norm is forgotten (its scale depends on B),
      so that first step counts as sensitive and is not scaled.
    - LRS / LARS: the linear-scaling factor k = B / base_batch follows the new B from this
      step on; LBT, static and AGS keep their LR (they do not scale it with B).
    - Momentum buffers and the step count carry over; the data position is in samples.
    Returns True: the AGS factors must be refreshed at the next step.
    """
    if isinstance(opt, TulaOptimizer):
        opt.scales, opt.prev_sq_norm = None, None
    for group, base, lam in zip(opt.param_groups, sched.base_lrs, sched.lr_lambdas):
        group["lr"] = base * lam(sched.last_epoch)
    if rank == 0:
        print(f"[train] global batch {old_batch} -> {new_batch}: LR {opt.param_groups[0]['lr']:.4g}"
              + (f", AGS s_max {opt.s_max:.3g}, scale factors re-measured" if isinstance(opt, TulaOptimizer) else ""),
              flush=True)  # fmt: skip
    return isinstance(opt, TulaOptimizer)


def set_post_local_iter(ddp: DDP, step: int) -> None:
    """Post-local SGD's hook counts steps in its own state; a resumed run continues the count."""
    state = getattr(ddp, "tula_polo_state", None)
    if state is not None:
        state.iter = step


def _stop(code: int, stops: StopSignals, seg: dict[str, Any], pos: Position, out_dir: Path, rank: int,
          label: str) -> None:  # fmt: skip
    """After the stop checkpoint: record the segment, leave the process group, and either let
    submitit requeue the job (USR2 under submitit) or exit (TERM). Never returns."""
    sig = stops.name.removeprefix("SIG") if stops.name and stops.CODES[signal.Signals[stops.name]] == code else (
        "USR2" if code == 2 else "TERM")  # this rank's own signal, else the one the peers agreed on
    requeue = stops.requeue_handler() if code == 2 else None
    if rank == 0:
        what = "checkpointed; submitit requeues the job" if requeue else "checkpointed; exiting"
        print(f"[{label}] SIG{sig} received: stopped after step {pos.step}, {what}", flush=True)
        _record_segment(out_dir, {**seg, "end_step": pos.step, "outcome": "requeued" if requeue else "stopped",
                                  "ended": _now(), "reason": f"SIG{sig} (preemption, time limit or cancel): {what}"})  # fmt: skip
    dist.shutdown(ok=True)
    sys.stdout.flush()
    if requeue is not None:
        requeue(signal.SIGUSR2, None)  # rank 0: scontrol requeue (or the local executor's requeue) and exit
    raise SystemExit(0 if requeue is not None else 128 + signal.SIGTERM)


