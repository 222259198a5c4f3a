"""data.decode: auto decided by measuring both decoders (tula.runtime.input.decoding): the choice
from injected timings, and the measurement itself on this CPU (nvJPEG's path, decode_batch, runs on
CPU tensors too; only the condition that both can serve, CUDA, is stood in for)."""

import pytest
import torch

from conftest import make_image_folder, make_jpeg_folder
from tula import config
from tula.runtime.input import data, decoding
from tula.runtime.input.loader import Loaders
from tula.runtime.step.stepstate import Position
from tula.runtime.step.stream import Stream


def _cfg(root, **data_section):
    return config.from_dict(
        {
            "workload": {"dataset": f"imagefolder:{root}", "seed": 3},
            "data": {"image_size": 16, **data_section},
        }
    )


def test_the_faster_decoder_is_kept_and_the_record_says_by_how_much():
    # the H100's figures (../shared/gpu/h100-2026-11-27): 11,000 images/s on the CPU's
    # loader workers, 4,500 with nvJPEG, at 128 images a batch
    seconds = {"cpu": 128 / 11000, "gpu": 128 / 4500}
    same = lambda v: v  # noqa: E731 - one process
    got = decoding.measure(seconds.get, agree=same)
    assert got["chosen"] == "cpu" and got["faster_by"] == pytest.approx(11000 / 4500)
    assert got["seconds_per_batch"] == seconds
    assert "on the CPU (loader workers) read a batch in 11.6 ms" in got["why"]
    assert "on the GPU (nvJPEG) in 28.4 ms (2.44x)" in got["why"]
    flipped = decoding.measure({"cpu": 0.03, "gpu": 0.01}.get, agree=same)
    assert flipped["chosen"] == "gpu" and flipped["faster_by"] == pytest.approx(3.0)
    # every rank keeps the same decoder: the slowest rank's time of each decides
    slow_gpu_rank = lambda v: [v[0], 4 * v[1]]  # noqa: E731
    assert decoding.measure({"cpu": 0.02, "gpu": 0.01}.get, agree=slow_gpu_rank)["chosen"] == "cpu"


def test_only_auto_on_cuda_with_every_file_a_jpeg_is_measured(tmp_path):
    jpegs = make_jpeg_folder(tmp_path / "jpegs")
    pngs = make_image_folder(tmp_path / "pngs", classes=2, train_per_class=2, val_per_class=1)
    j, p = data.load_config(_cfg(jpegs)), data.load_config(_cfg(pngs))
    assert decoding.contested(_cfg(jpegs).data, "cuda", j.train)
    assert not decoding.contested(_cfg(jpegs).data, "cpu", j.train)  # no device decoder here
    assert not decoding.contested(_cfg(jpegs, decode="cpu").data, "cuda", j.train)  # the user's
    assert not decoding.contested(_cfg(jpegs, decode="gpu").data, "cuda", j.train)
    assert not decoding.contested(_cfg(pngs).data, "cuda", p.train)  # nvJPEG reads no PNG


@pytest.mark.wallclock  # each decoder's seconds per batch under 10
def test_a_stream_measures_both_decoders_and_decodes_with_the_faster(tmp_path, monkeypatch):
    """Both of a JPEG folder's input paths read for real (loader workers decoding, or bytes
    decoded in the training process), each stream keeps the faster of its measurement."""
    root = make_jpeg_folder(tmp_path / "jpegs", n=12)
    cfg = _cfg(root, num_workers=1)
    ds = data.load_config(cfg)
    monkeypatch.setattr(decoding, "contested", lambda *a: True)  # as on CUDA
    stream = Stream(Loaders(cfg, ds, 0, 1, torch.device("cpu")), 4, False)
    got = stream.decode
    assert set(got["seconds_per_batch"]) == {"cpu", "gpu"}
    assert all(0 < s < 10 for s in got["seconds_per_batch"].values())
    assert got["chosen"] == min(got["seconds_per_batch"], key=got["seconds_per_batch"].get)
    assert stream.loader.dataset.encoded == (got["chosen"] == "gpu")
    x, y = next(stream.batches(1))
    assert x.shape == (4, 3, 16, 16) and y.shape == (4,)
    # another batch size's loader decodes where it was decided too
    stream.switch(8, Position(), park=False)
    assert stream.loader.dataset.encoded == (got["chosen"] == "gpu")
    # not contested: nothing measured, data.decode as configured
    monkeypatch.setattr(decoding, "contested", lambda *a: False)
    plain = Stream(Loaders(cfg, ds, 0, 1, torch.device("cpu")), 4, False)
    assert plain.decode is None and not plain.loader.dataset.encoded
