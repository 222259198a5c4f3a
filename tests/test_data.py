"""Datasets (digits, mnist1d, npz, image folders) and the resumable distributed sampler."""

import numpy as np
import pytest
import torch

from tula import config
from tula.runtime import data
from tula.config import ConfigError


def load(dataset, **workload):
    cfg = config.from_dict({"workload": {"dataset": dataset, **workload}})
    return data.load_config(cfg)



def consumed(n, batch, world, seed, epoch, start, stop_after=None):
    """Indices every rank's sampler yields from ``start`` (optionally only the first steps)."""
    samplers = [data.EpochBatchSampler(n, batch, r, world, seed) for r in range(world)]
    out, steps = [], 0
    for s in samplers:
        s.set_position(epoch, start)
    for parts in zip(*samplers):
        if stop_after is not None and steps == stop_after:
            break
        out += [i for part in parts for _, i in part]
        steps += 1
    return out, steps



def test_digits_split_and_standardisation():
    ds = load("digits", seed=0)
    assert ds.input_shape == (1, 8, 8) and ds.num_classes == 10
    assert ds.train_size == 1437 and ds.test_size == 360
    assert abs(float(ds.train.x.mean())) < 1e-4


def test_mnist1d_generated_locally():
    ds = load("mnist1d", mnist1d_samples=500, seed=1)
    assert ds.input_shape == (1, 40) and ds.train_size == 400 and ds.num_classes == 10


def test_npz_dataset_and_its_errors(tmp_path):
    rng = np.random.default_rng(0)
    good = tmp_path / "d.npz"
    np.savez(good, x_train=rng.normal(size=(20, 12, 12)), y_train=np.arange(20) % 3,
             x_test=rng.normal(size=(6, 12, 12)), y_test=np.arange(6) % 3)  # fmt: skip
    ds = load(f"npz:{good}")
    assert ds.input_shape == (1, 12, 12) and ds.num_classes == 3
    with pytest.raises(ConfigError, match="workload.dataset.*not found"):
        load(f"npz:{tmp_path / 'none.npz'}")
    bad = tmp_path / "bad.npz"
    np.savez(bad, x_train=np.zeros((4, 5)), y_train=np.zeros(4, dtype=int))
    with pytest.raises(ConfigError, match="missing array.*x_test"):
        load(f"npz:{bad}")
    labels = tmp_path / "labels.npz"
    np.savez(labels, x_train=np.zeros((4, 5)), y_train=np.zeros(3, dtype=int), x_test=np.zeros((2, 5)),
             y_test=np.zeros(2, dtype=int))  # fmt: skip
    with pytest.raises(ConfigError, match="y_train must be 1-D with one label per row"):
        load(f"npz:{labels}")


def test_image_folder_with_train_and_test_transforms(image_folder):
    cfg = config.from_dict({"workload": {"dataset": f"imagefolder:{image_folder}"},
                            "data": {"image_size": 16, "train_augment": "crop_flip"}})  # fmt: skip
    ds = data.load_config(cfg)
    assert ds.input_shape == (3, 16, 16) and ds.num_classes == 10
    assert (ds.train_size, ds.test_size) == (120, 40)
    # the test transform is deterministic; the training one is random but seeded per (epoch, sample)
    seeded = data.Seeded(ds.train, seed=0)
    assert torch.equal(seeded[(1, 5)][0], seeded[(1, 5)][0])
    assert not torch.equal(seeded[(1, 5)][0], seeded[(2, 5)][0])
    assert torch.equal(ds.test[3][0], ds.test[3][0])


def test_image_folder_layout_errors(tmp_path):
    (tmp_path / "a" / "train" / "cat").mkdir(parents=True)
    (tmp_path / "a" / "val").mkdir(parents=True)
    with pytest.raises(ConfigError, match="val has no class folders"):
        load(f"imagefolder:{tmp_path / 'a'}")


def test_each_epoch_is_a_permutation_split_over_the_ranks():
    idx, steps = consumed(103, 16, 2, seed=0, epoch=3, start=0)
    assert sorted(idx) == list(range(103)) and steps == 7 == data.steps_per_epoch(103, 16)
    assert consumed(103, 16, 2, 0, 3, 0)[0] != consumed(103, 16, 2, 0, 4, 0)[0]  # a new order every epoch


def test_a_relaunch_at_a_smaller_batch_consumes_every_sample_exactly_once():
    n, world = 1000, 2
    first, steps = consumed(n, 128, world, seed=5, epoch=2, start=0, stop_after=3)  # 3 steps at B=128, then OOM
    offset = 3 * 128
    rest, _ = consumed(n, 32, world, seed=5, epoch=2, start=offset)  # relaunch at B=32 from the checkpoint
    assert len(first) == offset and sorted(first + rest) == list(range(n))


def test_a_tail_smaller_than_n_is_left_out():
    idx, steps = consumed(10, 4, 3, seed=0, epoch=1, start=0)  # 4 + 4, then 2 < 3 workers
    assert steps == 2 and len(idx) == 8 and data.next_chunk(10, 4, 8, 3) == 0
