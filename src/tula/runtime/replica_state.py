"""The replica's state as a checkpoint holds it: what that is (:meth:`ReplicaState.state`),
the replica put back from it (:meth:`ReplicaState.load`), and put back after steps that must
leave no trace (:meth:`ReplicaState.undone`, the monitor's compute-only step).

:class:`tula.runtime.replica.Replica` inherits this half, so its model, optimizer, schedule,
scaler, evaluator, position and sums are still written by the replica's own methods only. A
checkpoint's other parts are their owners': each rank's RNG state and partial-epoch sums
(:mod:`tula.runtime.snapshot`, which writes and picks the file) and the job's ledger
(:class:`tula.production.ledger.Ledger`).
"""

from __future__ import annotations

import contextlib
import copy
from typing import TYPE_CHECKING, Any, Iterator

import torch
import torch.distributed as torch_dist

from tula import checkpoint
from tula.runtime.methods import follow_new_batch, set_post_local_iter
from tula.runtime.optim_state import load_optimizer_parts, load_optimizer_state, optimizer_parts
from tula.runtime.stepstate import Position

if TYPE_CHECKING:  # the fields Replica.__init__ sets (types only)
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tula.runtime.data import WorkloadData
    from tula.runtime.epoch_walk import EpochWalk
    from tula.runtime.evaluation import Evaluator
    from tula.runtime.recipe import Schedule


class ReplicaState:
    """The checkpointed half of :class:`tula.runtime.replica.Replica`."""

    ddp: DDP
    opt: torch.optim.Optimizer
    sched: Schedule
    data: WorkloadData
    steps_per_epoch: int
    scaler: torch.amp.GradScaler
    evaluator: Evaluator
    walk: EpochWalk
    noise_pairs: list[tuple[float, float]]
    device: torch.device
    global_batch: int
    rank: int

    def new_schedule(self) -> Schedule: ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds of this replica (besides each rank's RNG state and sums)."""
        return {
            "model": self.ddp.module.state_dict(),
            **optimizer_parts(self.opt),  # "optimizer" and "ags"
            "scheduler": self.sched.state_dict(),
            "scaler": self.scaler.state_dict(),
            "position": self.walk.pos.state_dict(),
            "evaluation": self.evaluator.state(),
            "noise_pairs": list(self.noise_pairs),
        }

    def load(
        self,
        state: dict[str, Any],
        stats: torch.Tensor,
        own: dict[str, Any] | None = None,
    ) -> None:
        """This replica as the checkpoint ``state`` holds it, each part put back by its owner's
        ``load_state_dict``, with this rank's partial-epoch sums ``stats``; ``own``: this rank's
        own model and optimizer parts (post-local SGD between two averages). A checkpoint
        written at another global batch (a relaunch at a smaller B) is followed by the
        optimizer and the schedule, and its noise pairs dropped."""
        self.ddp.module.load_state_dict(state["model"])
        load_optimizer_parts(self.opt, state)
        written_at = state.get("global_batch", self.global_batch)
        if written_at == self.global_batch:
            self.sched.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.evaluator.restore(state["evaluation"])
        self.walk.moved_to(Position.from_state_dict(state["position"]), stats)
        self.noise_pairs = [tuple(p) for p in state.get("noise_pairs", [])]
        set_post_local_iter(self.ddp, self.walk.pos.step)
        if own is not None:
            self.ddp.module.load_state_dict(own["model"])
            load_optimizer_parts(self.opt, own)
        if written_at != self.global_batch:
            self.noise_pairs = []
            self.walk.refresh_next(
                follow_new_batch(self.opt, written_at, self.global_batch, self.rank)
            )
            # the schedule at the new B, where the run's epochs stand
            self.sched = self.new_schedule()
            self.sched.fast_forward(
                round(self.walk.pos.epochs_done(self.data.train_size) * self.steps_per_epoch)
            )

    def take_weights_of_rank0(self) -> None:
        """Rank 0's weights on every rank (compute-only steps stepped each replica on its own
        gradient: the gradient noise scale is measured at one point)."""
        with torch.no_grad():
            for t in self.ddp.module.state_dict().values():
                torch_dist.broadcast(t, src=0)

    def take_noise_pairs(self) -> list[tuple[float, float]]:
        """This epoch's AGS noise pairs, handed over and forgotten (the epoch's noise scale)."""
        pairs, self.noise_pairs = self.noise_pairs, []
        return pairs

    @contextlib.contextmanager
    def undone(self) -> Iterator[None]:
        """Run steps, then put back exactly everything a step changes (model, optimizer,
        schedule, scaler, position, sums, RNG and the step's flags): the monitor's
        compute-only step. Copies go to host memory: no extra device memory."""
        model = {
            k: v.detach().to("cpu", copy=True) for k, v in self.ddp.module.state_dict().items()
        }
        saved = [copy.deepcopy(self.opt.state_dict()), self.sched.state_dict()]
        saved += [self.scaler.state_dict(), checkpoint.rng_state()]
        walked, pairs = self.walk.saved(), list(self.noise_pairs)
        # DDP broadcasts rank 0's buffers (batch-norm statistics) before a forward only if the
        # step before synced its gradients: a no_sync step turns that off for the next one
        forward_sync = self.ddp.require_forward_param_sync
        yield
        self.ddp.module.load_state_dict(model)
        load_optimizer_state(self.opt, saved[0])
        self.sched.load_state_dict(saved[1])
        self.scaler.load_state_dict(saved[2])
        checkpoint.set_rng_state(saved[3])
        self.walk.put_back(walked)
        self.noise_pairs = pairs
        self.ddp.require_forward_param_sync = forward_sync
