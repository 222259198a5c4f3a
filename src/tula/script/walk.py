"""Where a user's script stands in its training, as Tula sees it through ``run.epochs()``,
``run.batches(loader)`` and the step marker: the epoch, the batches stepped in it, the steps
taken, and the kind of the next step ("start": an epoch's first, "partial": a short batch,
"plain"). It is what a checkpoint keeps of the loop (:meth:`Walk.state_dict`), with each
rank's random state as the epoch's loader began, so that a resumed epoch draws the same
batches: the loader is started again from that state and the batches already stepped are
read and skipped."""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from tula import checkpoint


def batch_length(batch: Any) -> int | None:
    """Samples in a batch: a tensor's first dimension, or that of a tuple's, list's or dict's
    first tensor (None where none is found)."""
    if hasattr(batch, "shape") and len(batch.shape) > 0:
        return int(batch.shape[0])
    items = batch.values() if isinstance(batch, dict) else batch
    if isinstance(items, (list, tuple)) or isinstance(batch, dict):
        for item in items:
            n = batch_length(item)
            if n is not None:
                return n
    return None


class Walk:
    """The script's place in its training (module docstring)."""

    def __init__(self, local_batch: int):
        self.local_batch = local_batch
        self.epoch = 0  # the epoch run.epochs() is in (0-based, as the script counts)
        self.batches_done = 0  # batches stepped in this epoch
        self.steps_done = 0  # steps taken since training began (resumed ones counted)
        self.in_epoch = False  # inside run.batches()
        self.length: int | None = None  # batches in this epoch (len(loader)), where known
        self.next_kind = "plain"  # the kind of the step about to run
        self.epoch_rng: dict[str, Any] | None = None  # the random state as the epoch began
        self.resume_at: tuple[int, int] | None = None  # (epoch, batches) a resumed epoch skips to
        self.resume_rng: dict[str, Any] | None = None  # the random state where it stopped
        self.cut = False  # a probe asks that this epoch end now (its next step: a start)
        self.closed = False  # run.batches closed the epoch the script is finishing
        self.cuttable = True  # can it end an epoch early (run.batches can; Lightning's loop not)
        self.train_samples: int | None = None  # len(loader.dataset), where known
        self.seen_lengths: set[int] = set()  # lengths of batches not an epoch's last (the check's)

    # -- the epochs and their batches -----------------------------------------------------
    def epochs(self, count: int | None) -> Iterator[int]:
        """Epoch indices from where training stands to ``count`` (None: until stopped)."""
        while count is None or self.epoch < count:
            epoch, self.closed = self.epoch, False
            yield epoch
            if self.epoch == epoch:  # stepped without run.batches, which closes its epoch
                self.close_epoch()

    def close_epoch(self) -> None:
        self.epoch += 1
        self.batches_done, self.in_epoch, self.cut, self.closed = 0, False, False, True

    def epochs_done(self) -> int:
        """Epochs trained, the one the script is finishing counted (its batches used up)."""
        return self.epoch if self.closed else self.epoch + 1

    def batches(self, loader: Iterable, on_start, on_end) -> Iterator[Any]:
        """The loader's batches from where this epoch stands, each step's kind said before it
        runs; ``on_start()`` as the epoch's loader is about to start, ``on_end()`` once its
        batches are used up (or a probe cut it)."""
        dataset = getattr(loader, "dataset", None)
        try:
            length = len(loader)  # type: ignore[arg-type]
        except TypeError:
            length = None
        skip = self.begin_epoch(length, len(dataset) if hasattr(dataset, "__len__") else None)
        on_start()
        it = iter(loader)
        for _ in range(skip):  # what the interrupted run stepped: read again, not stepped
            next(it, None)
        if skip:
            self.skipped()
        for batch in it:
            self.at_batch(batch)
            yield batch
            if self.cut:
                break
        self.end_loop_epoch()
        on_end()
        self.close_epoch()

    # -- an epoch the walk is told of (a loop of its own: Lightning's, run.batches') ------
    def begin_epoch(
        self, length: int | None, train_samples: int | None, cuttable: bool = True
    ) -> int:
        """An epoch's loader is about to start (``length`` batches, of a set of
        ``train_samples``); returns how many of its batches a resumed epoch skips, the random
        state set as the interrupted run's was when its loader started. ``cuttable``: can the
        loop end the epoch early when a probe asks (:meth:`cut_epoch`)."""
        self.length, self.cuttable = length, cuttable
        if train_samples is not None:
            self.train_samples = train_samples
        skip = 0
        if self.resume_at is not None and self.resume_at[0] == self.epoch:
            skip = self.resume_at[1]
            if self.epoch_rng is not None:
                checkpoint.set_rng_state(self.epoch_rng)
        else:
            self.epoch_rng = checkpoint.rng_state()
            self.batches_done = 0
        self.in_epoch, self.cut, self.closed = True, False, False
        return skip

    def follow_loop(self) -> None:
        """A loop that resumes itself (Lightning's, from its own checkpoint): this epoch's place
        is its own, no batch is skipped here."""
        self.resume_at = self.resume_rng = None

    def end_loop_epoch(self) -> None:
        """The epoch's batches are used up (its last step ran)."""
        self.in_epoch = False

    def skipped(self) -> None:
        """The resumed epoch's stepped batches are read: the random state where it stopped."""
        if self.resume_rng is not None:
            checkpoint.set_rng_state(self.resume_rng)
        self.resume_at = self.resume_rng = None

    def at_batch(self, batch: Any) -> None:
        """The next step takes ``batch``: its kind (an epoch's first, a short one, plain)."""
        n = batch_length(batch)
        first = self.batches_done == 0
        short = n is not None and n < self.local_batch
        self.next_kind = "start" if first else "partial" if short else "plain"
        last = self.length is not None and self.batches_done == self.length - 1
        if n is not None and not last:  # the epoch's last batch may be short by right
            self.seen_lengths.add(n)

    def cut_epoch(self) -> None:
        """End this epoch after the step under way (a probe wants the next one's start)."""
        self.cut = True

    def stepped(self) -> None:
        """A step ran on the batch run.batches gave (or on the script's own)."""
        self.steps_done += 1
        if self.in_epoch:
            self.batches_done += 1
        self.next_kind = "plain"

    def plain_ahead(self) -> int | None:
        """Plain steps from the next one on, where the epoch's length is known (None: not
        known, every step counts as plain): the epoch's first and its last are never."""
        if self.length is None or not self.in_epoch:
            return None
        if self.batches_done == 0:
            return 0
        return max(self.length - 1 - self.batches_done, 0)

    def place(self) -> int:
        """Where the next step falls in its epoch (0: the epoch's first)."""
        if not self.in_epoch or (self.length is not None and self.batches_done >= self.length):
            return 0
        return self.batches_done

    # -- what a checkpoint keeps ----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The place to resume from (the current random state goes in per rank, beside)."""
        return {
            "epoch": self.epoch,
            "batches_done": self.batches_done,
            "steps_done": self.steps_done,
            "in_epoch": self.in_epoch,
            "local_batch": self.local_batch,
        }

    def load_state_dict(
        self, state: dict[str, Any], epoch_rng: dict | None, rng: dict | None, world_ratio: float
    ) -> None:
        """Stand where ``state`` stood: its epoch resumes after the batches it stepped (counted
        at this run's batch: ``world_ratio`` is the checkpoint's global batch over this one's,
        a relaunch at a smaller B skips more of them), from ``epoch_rng``, then ``rng``."""
        self.epoch, self.steps_done = state["epoch"], state["steps_done"]
        done = state["batches_done"] if state["in_epoch"] else 0
        skip = round(done * world_ratio)
        self.resume_at = (self.epoch, skip) if skip else None
        self.epoch_rng, self.resume_rng = epoch_rng, rng
        if not skip and rng is not None:
            checkpoint.set_rng_state(rng)
        self.batches_done = skip
