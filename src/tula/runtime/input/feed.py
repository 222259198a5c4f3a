"""A rank's training batches on the device (:class:`DeviceFeed`), in the order of its
:class:`tula.runtime.input.loader.EpochBatchSampler`: gathered from a training set kept there, or
streamed from the DataLoader with the next batch copied (or decoded) beside the running step."""

from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch.utils.data import DataLoader

from tula.runtime.input.data import WorkloadData
from tula.runtime.input.images import Encoded
from tula.runtime.input.loader import EpochBatchSampler, Loaders, epoch_permutation


class DeviceFeed:
    """This rank's training batches on the device, in the sampler's order from its position.

    Two sources, one order (the sampler's: every sample once per epoch, resume unchanged):

    - resident (:func:`tula.runtime.input.loader.keep_on_device`): the training set was copied to
      the device once; an epoch's permutation goes there once, and each batch is a gather on
      the device. Nothing crosses the bus per step, nothing waits for the host.
    - streamed: the DataLoader (its workers, pinned memory) hands the next batch while the
      current step runs on the device; it is copied on a side CUDA stream, and the step's
      stream waits for that copy only. The host gathers batch k+1 while the device computes
      step k, because the step is queued without a host read (:meth:`Replica.step`).

    On CPU both are the plain gather; the code path is the same.
    """

    def __init__(
        self,
        data: WorkloadData,
        loader: DataLoader,
        sampler: EpochBatchSampler,
        device: torch.device,
        channels_last: bool,
        resident: bool,
        decode: Callable[[Encoded], torch.Tensor],
    ):
        self.loader, self.sampler, self.device, self.channels_last = (
            loader,
            sampler,
            device,
            channels_last,
        )
        self.decode = decode  # an encoded batch (JPEG files) into the step's input, on the device
        self.as_input = data.as_input  # an integer set standardised here, on the device
        self.resident = resident
        self.stream = (
            torch.cuda.Stream(device) if device.type == "cuda" and not self.resident else None
        )
        if self.resident:
            self.x, self.y = data.resident_on(device, channels_last)

    @classmethod
    def of(
        cls,
        loaders: Loaders,
        loader: DataLoader,
        sampler: EpochBatchSampler,
        channels_last: bool,
    ) -> "DeviceFeed":
        """The feed over one of ``loaders``' training loaders, as they decided it: the set kept
        on the device or not, encoded batches decoded there with ``data.*``'s views
        (:func:`tula.runtime.input.images.decode_batch`)."""
        return cls(
            loaders.data,
            loader,
            sampler,
            loaders.device,
            channels_last,
            loaders.resident,
            loaders.decode,
        )

    def retarget(self, loader: DataLoader, sampler: EpochBatchSampler) -> "DeviceFeed":
        """The same feed (a resident set stays where it is) over another batch size's loader."""
        self.loader, self.sampler = loader, sampler
        return self

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self._gathered() if self.resident else self._streamed()

    def _gathered(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        s = self.sampler
        perm = epoch_permutation(s.n, s.seed, s.epoch)
        if self.device.type == "cuda":
            perm = perm.pin_memory()
        perm = perm.to(self.device, non_blocking=True)
        for off, k in s.chunks():
            idx = perm[off + s.rank : off + k : s.world]
            # indexing keeps the resident set's channels_last layout (index_select would return
            # NCHW, and the step would copy the batch once more to convert it)
            yield self.as_input(self.x[idx]), self.y[idx]

    def _prepare(self, batch):
        if batch is None:
            return None
        x, y = batch
        if self.stream is None:
            return self._layout(self._on_device(x)), y.to(self.device)
        with torch.cuda.stream(self.stream):  # the copy (or the decoding) beside the running step
            return self._layout(self._on_device(x)), y.to(self.device, non_blocking=True)

    def _on_device(self, x):
        if isinstance(x, Encoded):
            return self.decode(x)
        return self.as_input(x.to(self.device, non_blocking=self.stream is not None))

    def _layout(self, x: torch.Tensor) -> torch.Tensor:
        return (
            x.contiguous(memory_format=torch.channels_last)
            if self.channels_last and x.ndim == 4
            else x
        )

    def _streamed(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        it = iter(self.loader)
        ahead = self._prepare(next(it, None))
        while ahead is not None:
            x, y = ahead
            if self.stream is not None:
                current = torch.cuda.current_stream(self.device)
                current.wait_stream(self.stream)
                x.record_stream(current)
                y.record_stream(current)
            yield (
                x,
                y,
            )  # the step is queued on the device; then the next batch is gathered and copied
            ahead = self._prepare(next(it, None))
