"""Datasets (tula.runtime.data): digits, mnist1d, npz, image folders, and their errors."""

import numpy as np
import pytest
import torch

from tula import config
from tula.config import ConfigError
from tula.runtime import data, loader


def load(dataset, **workload):
    cfg = config.from_dict({"workload": {"dataset": dataset, **workload}})
    return data.load_config(cfg)


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
    np.savez(
        good,
        x_train=rng.normal(size=(20, 12, 12)),
        y_train=np.arange(20) % 3,
        x_test=rng.normal(size=(6, 12, 12)),
        y_test=np.arange(6) % 3,
    )
    ds = load(f"npz:{good}")
    assert ds.input_shape == (1, 12, 12) and ds.num_classes == 3
    with pytest.raises(ConfigError, match="workload.dataset.*not found"):
        load(f"npz:{tmp_path / 'none.npz'}")
    bad = tmp_path / "bad.npz"
    np.savez(bad, x_train=np.zeros((4, 5)), y_train=np.zeros(4, dtype=int))
    with pytest.raises(ConfigError, match="missing array.*x_test"):
        load(f"npz:{bad}")
    labels = tmp_path / "labels.npz"
    np.savez(
        labels,
        x_train=np.zeros((4, 5)),
        y_train=np.zeros(3, dtype=int),
        x_test=np.zeros((2, 5)),
        y_test=np.zeros(2, dtype=int),
    )
    with pytest.raises(ConfigError, match="y_train must be 1-D with one label per row"):
        load(f"npz:{labels}")


def test_image_folder_with_train_and_test_transforms(image_folder):
    cfg = config.from_dict(
        {
            "workload": {"dataset": f"imagefolder:{image_folder}"},
            "data": {"image_size": 16, "train_augment": "crop_flip"},
        }
    )
    ds = data.load_config(cfg)
    assert ds.input_shape == (3, 16, 16) and ds.num_classes == 10
    assert (ds.train_size, ds.test_size) == (120, 40)
    # the test transform is deterministic; the training one is random but seeded per (epoch, sample)
    seeded = loader.Seeded(ds.train, seed=0)
    assert torch.equal(seeded[(1, 5)][0], seeded[(1, 5)][0])
    assert not torch.equal(seeded[(1, 5)][0], seeded[(2, 5)][0])
    assert torch.equal(ds.test[3][0], ds.test[3][0])


def test_image_folder_layout_errors(tmp_path):
    (tmp_path / "a" / "train" / "cat").mkdir(parents=True)
    (tmp_path / "a" / "val").mkdir(parents=True)
    with pytest.raises(ConfigError, match="val has no class folders"):
        load(f"imagefolder:{tmp_path / 'a'}")
