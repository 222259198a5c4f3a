"""Image folders (tula.runtime.input.images): per-sample augmentation draws, the tensor path against
torchvision's PIL transforms, a resumed loader's images, and data.num_workers: auto."""

import math
import os

import pytest
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import functional as TF

import bounds
from conftest import make_jpeg_folder
from tula import config
from tula.config import ConfigError
from tula.runtime.input import data, images, loader
from tula.runtime.input.feed import DeviceFeed


def folder_config(root, **data_section):
    return config.from_dict(
        {
            "workload": {"dataset": f"imagefolder:{root}", "seed": 3},
            "data": {"image_size": 16, **data_section},
        }
    )


@pytest.mark.parametrize("augment", ["random_resized_crop", "crop_flip"])
def test_a_samples_box_and_flip_depend_on_seed_epoch_and_index_only(augment):
    d = folder_config("/nowhere", train_augment=augment).data
    draws = {
        (s, e, i): images.augment_params(d, s, e, i, 30, 40)
        for s in (0, 1)
        for e in (1, 2)
        for i in range(50)
    }
    # the same key draws the same box and flip, whatever was drawn in between and in any order
    torch.manual_seed(123)  # torch's global RNG plays no part
    assert all(images.augment_params(d, *k, 30, 40) == a for k, a in reversed(list(draws.items())))
    # and different keys mostly differ (crop_flip has 5 x 5 offsets x 2 flips = 50 outcomes)
    assert len(set(draws.values())) >= (150 if augment == "random_resized_crop" else 45)
    flips = [a.flip for a in draws.values()]
    lo, hi = bounds.binomial_band(len(flips), 0.5)  # a fair coin
    assert lo <= sum(flips) / len(flips) <= hi
    (min_scale, _), (lo_r, hi_r) = images.SCALE, map(math.exp, images.LOG_RATIO)
    half = 1 / 2  # round() moves a side by half a pixel at most
    for a in draws.values():
        # a box inside the image, 8-100 % of it, aspect 3/4-4/3
        if augment == "random_resized_crop":
            assert 0 <= a.top and a.top + a.height <= 30 and 0 <= a.left and a.left + a.width <= 40
            # some real box within half a pixel of each side had the drawn area and aspect
            h, w = a.height, a.width
            assert (w + half) * (h + half) >= min_scale * 1200 and (w - half) * (h - half) <= 1200
            assert (w + half) / (h - half) >= lo_r and (w - half) / (h + half) <= hi_r
        else:  # an offset into the image padded by image_size / 8 = 2 on each side
            assert 0 <= a.top <= 4 and 0 <= a.left <= 4 and a.height == a.width == 16


def test_a_thin_image_falls_back_to_the_central_crop_as_torchvision_does():
    g = images.sample_generator(0, 1, 0)
    assert images.resized_crop_box(g, 4, 200) == (
        0,
        97,
        4,
        5,
    )  # no random box fits: central 4/3 crop


def test_the_tensor_path_matches_torchvisions_pil_transforms_within_a_pixel_level(image_folder):
    d = folder_config(image_folder, image_size=12, resize=14).data
    for f in sorted((image_folder / "train").rglob("*.png"))[:6]:
        img = images.decode(f)
        with Image.open(f) as im:
            rgb = im.convert("RGB")
            test_pil = T.Compose([T.Resize(14), T.CenterCrop(12), T.PILToTensor()])(rgb)
            a = images.augment_params(d, 0, 1, 7, img.shape[1], img.shape[2])
            train_pil = TF.pil_to_tensor(
                TF.resized_crop(rgb, a.top, a.left, a.height, a.width, [12, 12])
            )
        assert torch.equal(img, TF.pil_to_tensor(rgb))  # decoding is lossless for PNG on both
        assert (images.test_view(img, d).int() - test_pil.int()).abs().max() <= 1
        train_pil = TF.hflip(train_pil) if a.flip else train_pil
        assert (images.train_view(img, d, a).int() - train_pil.int()).abs().max() <= 1


def test_other_formats_are_decoded_by_pillow(tmp_path):
    f = tmp_path / "x.bmp"
    Image.new("RGB", (5, 3), (10, 20, 30)).save(f)
    x = images.decode(f)
    assert x.shape == (3, 3, 5) and x.dtype == torch.uint8 and x[:, 0, 0].tolist() == [10, 20, 30]


def batches_from(root, ds, epoch, offset, workers, count):
    cfg = folder_config(root, num_workers=workers)
    dl, sampler = loader.Loaders(cfg, ds, 0, 1, torch.device("cpu")).train(8)
    if workers:
        # pytest's own process holds threads by now (gloo's loops from the in-process groups of
        # earlier tests), as a training worker does: on an interpreter whose fork can deadlock
        # the child (3.11.7 here: a segfault in threading._after_fork, then a hang on its head
        # lock, in two clean clones in a row) the loader's workers start from a forkserver
        ctx = dl.multiprocessing_context
        method = ctx.get_start_method() if ctx is not None else "fork"
        assert method == ("forkserver" if loader.fork_deadlocks() else "fork")
    sampler.set_position(epoch, offset)
    return [x for (x, _), _ in zip(dl, range(count))]


def test_a_resumed_loader_with_other_workers_sees_the_same_images(image_folder):
    ds = data.load_config(folder_config(image_folder))
    straight = batches_from(image_folder, ds, 2, 0, 0, 5)  # epoch 2 from its start, in this process
    # resumed after 3 batches, two loader processes
    resumed = batches_from(image_folder, ds, 2, 24, 2, 2)
    assert len(resumed) == 2 and all(torch.equal(a, b) for a, b in zip(straight[3:], resumed))
    # another epoch: other boxes
    assert not torch.equal(straight[3], batches_from(image_folder, ds, 3, 24, 0, 1)[0])


def test_num_workers_auto_counts_the_cores_each_training_worker_has(image_folder, monkeypatch):
    # a task bound to 8 cores
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    folder = data.load_config(folder_config(image_folder))
    digits = data.load_config(config.from_dict({"workload": {"dataset": "digits"}}))
    d = folder_config(image_folder).data
    assert d.num_workers == "auto"  # the default
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    # 8 cores / 2 workers here, one for itself
    assert loader.loader_workers(d, folder, world=4) == 3
    assert loader.loader_workers(d, digits, world=4) == 0  # in memory: nothing per sample to spread
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert loader.loader_workers(d, folder, world=8) == 0
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    assert loader.loader_workers(d, folder, world=1) == 7
    assert (
        loader.loader_workers(folder_config(image_folder, num_workers=2).data, folder, world=1) == 2
    )
    with pytest.raises(ConfigError, match="data.num_workers"):
        folder_config(image_folder, num_workers="many")


@pytest.mark.parametrize("augment", ["random_resized_crop", "crop_flip", "none"])
def test_the_device_decoding_path_gives_the_cpu_paths_images_from_the_same_boxes(tmp_path, augment):
    """data.decode: gpu's plumbing, run on CPU tensors (torchvision's decode_jpeg takes a
    batch on the CPU too): loader workers hand file bytes and boxes, the feed decodes the batch
    and crops, resizes, flips and normalises it as tensors. With the same decoder on both sides
    (libjpeg-turbo here; nvJPEG on CUDA may differ by a few levels) the images are the CPU
    path's, sample for sample, and so are the boxes, at any loader-worker count and resumed."""
    root = make_jpeg_folder(tmp_path / "jpegs")
    cpu_cfg = folder_config(root, train_augment=augment, decode="cpu", num_workers=0)
    gpu_cfg = folder_config(root, train_augment=augment, decode="gpu", num_workers=2)
    ds = data.load_config(cpu_cfg)
    assert images.decode_on_device(gpu_cfg.data, "cpu", ds.train)
    # auto: only on CUDA
    assert not images.decode_on_device(folder_config(root).data, "cpu", ds.train)
    assert images.decode_on_device(folder_config(root).data, "cuda", ds.train)
    dev = torch.device("cpu")
    got = {}
    for name, cfg in (("cpu", cpu_cfg), ("gpu", gpu_cfg)):
        loaders = loader.Loaders(cfg, ds, 0, 1, dev)
        dl, sampler = loaders.train(4)
        feed = DeviceFeed.of(loaders, dl, sampler, channels_last=False)
        sampler.set_position(2, 2)  # resumed mid-epoch
        got[name] = [(x, y) for x, y in feed]
    assert len(got["cpu"]) == len(got["gpu"]) == 1  # 6 samples, from the 3rd: one batch of 4
    (xc, yc), (xg, yg) = got["cpu"][0], got["gpu"][0]
    assert xc.shape == xg.shape == (4, 3, 16, 16) and torch.equal(yc, yg)
    assert torch.allclose(xc, xg, atol=1e-5)
    enc, _ = ds.train.encoded(3, 2, [0, 1])  # the boxes are the CPU path's draws
    for i, box in zip([0, 1], enc.boxes.tolist()):
        img = images.decode(ds.train.samples[i][0])
        a = images.augment_params(ds.train.d, 3, 2, i, img.shape[1], img.shape[2])
        assert box == (
            [a.top, a.left, a.height, a.width, int(a.flip)]
            if augment != "none"
            else [0, 0, 0, 0, 0]
        )


def test_gpu_decoding_of_files_that_are_not_jpeg_is_refused_naming_the_key(image_folder):
    ds = data.load_config(folder_config(image_folder))  # PNGs
    with pytest.raises(ConfigError, match=r"data.decode.*JPEG files only.*\.png is not one"):
        images.decode_on_device(folder_config(image_folder, decode="gpu").data, "cuda", ds.train)
    # auto: the CPU path
    assert not images.decode_on_device(folder_config(image_folder).data, "cuda", ds.train)
    digits = data.load_config(
        config.from_dict({"workload": {"dataset": "digits"}, "data": {"decode": "gpu"}})
    )
    with pytest.raises(ConfigError, match="data.decode.*imagefolder"):
        images.decode_on_device(
            config.from_dict({"data": {"decode": "gpu"}}).data, "cuda", digits.train
        )
