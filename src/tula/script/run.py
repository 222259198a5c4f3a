"""``run = tula.script.attach(...)``: the user's script asks Tula for its batch and role, marks
its steps, hands its parts to checkpoint and reports each epoch. One :class:`Run` per
process; what it does at each of those calls is its role's (:mod:`tula.script.roles`): nothing
beyond the script's own loop when Tula did not start it, else the check, the memory probe,
a timing probe or the production job."""

from __future__ import annotations

import atexit
import contextlib
import functools
from typing import Any, Callable, Iterable, Iterator

from tula.runtime.group.dist import release_at_exit, steady_host_memory, worker_env
from tula.script.base import Stepping
from tula.script.parts import Parts
from tula.script.roles import driver_for
from tula.script.walk import Walk
from tula.workers import script_run
from tula.workers.script_run import ScriptRun

_CURRENT: list[Run] = []
# a probe's or a check's epochs: the run ends itself once it has what it needs
PROBE_EPOCHS = 10**6


def attach(
    local_batch: int, epochs: int | None = None, lr: float | None = None, seed: int | None = None
) -> Run:
    """This process's run: Tula's when Tula started the script (``TULA_SCRIPT_RUN``), else
    the script's own, from these arguments (the batch per worker, the epochs, the LR). Call it
    once, before the model and the loader are built: ``run.local_batch`` is the batch to load."""
    run = Run(ScriptRun.from_env(), local_batch, epochs, lr)
    _CURRENT[:] = [run]
    return run


def current() -> Run | None:
    """The run :func:`attach` made in this process, if any."""
    return _CURRENT[0] if _CURRENT else None


class Run:
    """What Tula asks of this process and what the script tells it (module docstring).

    Read: ``role`` (None without Tula; "check", "memory", "probe" or "production"),
    ``probing`` (a short run whose training is not kept: skip what only a real run needs),
    ``local_batch``, ``global_batch``, ``world``, ``rank``, ``lr``, ``num_epochs``,
    ``probe_steps`` (the timed steps a probe wants at least)."""

    def __init__(
        self, spec: ScriptRun | None, local_batch: int, epochs: int | None, lr: float | None
    ):
        wenv = worker_env()
        if spec is not None:  # a worker of Tula's: glibc's malloc as every worker sets it
            steady_host_memory()
            # at exit, the run's parts (the DDP model) let go, then collected with the groups
            # they hold while the interpreter still runs (tula.runtime.group.dist.release_at_exit)
            release_at_exit()
            atexit.register(_CURRENT.clear)
        self.rank, self.world = wenv.rank, wenv.world_size
        if spec is not None and spec.workers != self.world:
            raise RuntimeError(
                f"tula.script: Tula started {spec.workers} worker(s) but this process sees "
                f"WORLD_SIZE={self.world}"
            )
        self.spec = spec
        self.local_batch = spec.local_batch if spec else int(local_batch)
        self.global_batch = self.local_batch * self.world
        self.lr = spec.lr if spec and spec.lr is not None else lr
        self.epochs_asked = spec.epochs if spec and spec.epochs else epochs
        self.parts = Parts()
        self.walk = Walk(self.local_batch)
        self.finished, self.outcome = False, None
        self.driver = driver_for(self)
        script_run.after_script(self.finish)

    @property
    def role(self) -> str | None:
        return self.spec.role if self.spec else None

    @property
    def probing(self) -> bool:
        """A check or a probe: its steps are timed or tried, its training is not kept."""
        return self.role in ("check", "memory", "probe")

    @property
    def num_epochs(self) -> int | None:
        """The epochs to train (Tula's, else the script's); a probe's run takes as many as it
        needs and ends the process itself: for a loop of its own (Lightning's max_epochs)."""
        return PROBE_EPOCHS if self.probing else self.epochs_asked

    @property
    def probe_steps(self) -> int | None:
        ask = self.spec.probe if self.spec else None
        return ask.min_steps if ask else None

    # -- what the script calls ------------------------------------------------------------
    def keep(self, **parts: Any) -> Run:
        """The parts Tula checkpoints (a model, in DDP if it is wrapped; the optimizer, the LR
        scheduler, a GradScaler, an EMA: anything with ``state_dict``); in the production job
        they are put back from the newest checkpoint here when it resumes. Returns the run."""
        self.parts.add(parts)
        self.driver.kept()
        return self

    def watch(self, **parts: Any) -> Run:
        """Parts Tula measures (the model's parameters and device, the optimizer's state, the
        DDP model a compute-only step runs under) but does not save: what ``keep`` saves
        holds them already (Lightning's own checkpoint, :mod:`tula.script.lightning`)."""
        self.parts.add(parts, saved=False)
        return self

    def step(self, fn: Callable | None = None) -> Any:
        """Mark the training step: ``train_step = run.step(train_step)`` wraps the function
        (its return value, the loss, goes to the curves), or ``with run.step(): ...`` marks a
        block. Tula times it (a probe: also as a compute-only step under DDP's ``no_sync()``),
        measures its memory, stops there when a probe's precision is reached, and checkpoints
        between two steps when the job is asked to stop."""
        if fn is None:
            return self._stepping()

        @functools.wraps(fn)
        def stepped(*args: Any, **kwargs: Any) -> Any:
            with self._stepping() as now:
                now.returned(fn(*args, **kwargs))
            return now.value

        return stepped

    @contextlib.contextmanager
    def _stepping(self) -> Iterator[Stepping]:
        now = Stepping(self.walk.next_kind)
        with self.driver.step(now):
            yield now
        self.walk.stepped()
        self.driver.stepped(now)

    def epochs(self, count: int | None = None) -> Iterator[int]:
        """The epochs to train, from where the run stands (a resumed one: its checkpoint's
        epoch); ``count`` the script's own (default: attach's ``epochs``, or Tula's). A
        probe's run goes on until it has measured what it needs. When they are done, the run
        finishes (:meth:`finish`)."""
        if self.spec is not None and self.spec.epochs or count is None:
            count = self.num_epochs
        if count is None:
            raise ValueError("tula.script: run.epochs() needs a count (or attach(epochs=...))")
        yield from self.walk.epochs(count)
        self.finish()

    def batches(self, loader: Iterable) -> Iterator[Any]:
        """The loader's batches from where this epoch stands (after a resume, the ones already
        stepped are skipped), each step's kind known to Tula (an epoch's first, a short last
        batch) and the loader's start timed with the step it feeds."""
        yield from self.walk.batches(loader, self.driver.epoch_starts, self.driver.epoch_ends)

    # -- a loop Tula does not iterate (Lightning's fit loop: tula.script.lightning) -------
    def loop_epoch_starts(self, length: int | None, train_samples: int | None) -> None:
        """The loop's epoch is about to start (``length`` batches of a set of
        ``train_samples``); a resumed loop places itself (Lightning's own checkpoint)."""
        self.walk.begin_epoch(length, train_samples, cuttable=False)
        self.walk.follow_loop()
        self.driver.epoch_starts()

    def loop_batch(self, batch: Any) -> None:
        """The loop is about to step on ``batch`` (its kind: an epoch's first, a short one)."""
        self.walk.at_batch(batch)

    def loop_epoch_ends(self) -> None:
        """The loop's epoch has no batch left: what follows until the next epoch's start (its
        validation) is what the script does between epochs."""
        self.walk.end_loop_epoch()
        self.driver.epoch_ends()
        self.walk.close_epoch()

    def epoch_end(
        self,
        loss: float | None = None,
        metric: float | None = None,
        test_loss: float | None = None,
        test_metric: float | None = None,
    ) -> None:
        """The epoch's train loss and metric and, where the script evaluates, the test set's:
        metrics.csv, TensorBoard and final.json show them."""
        row = {
            "train_loss": loss,
            "train_acc": metric,
            "test_loss": test_loss,
            "test_acc": test_metric,
        }
        self.driver.epoch_end({k: None if v is None else float(v) for k, v in row.items()})

    def finish(self) -> Any:
        """Training is over (run.epochs() says it when its epochs are done): the production job
        writes its last checkpoint and final.json. Returns the job's outcome."""
        if not self.finished:
            self.finished = True
            self.outcome = self.driver.finish()
        return self.outcome
