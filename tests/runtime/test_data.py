"""Datasets (tula.runtime.input.data): digits, mnist1d, npz, image folders, and their errors."""

import numpy as np
import pytest
import torch

import bounds
from tula import config
from tula.config import ConfigError
from tula.runtime.input import data, loader


def load(dataset, **workload):
    cfg = config.from_dict({"workload": {"dataset": dataset, **workload}})
    return data.load_config(cfg)


def test_digits_split_and_standardisation():
    ds = load("digits", seed=0)
    assert ds.input_shape == (1, 8, 8) and ds.num_classes == 10
    assert ds.train_size == 1437 and ds.test_size == 360
    assert abs(float(ds.train.x.mean())) < bounds.FLOAT32_SUM


def test_mnist1d_generated_locally():
    ds = load("mnist1d", mnist1d_samples=500, seed=1)
    assert ds.input_shape == (1, 40) and ds.train_size == 400 and ds.num_classes == 10


def test_a_built_in_set_is_made_once_then_read_from_the_cache_as_the_library_made_it(
    tmp_path, monkeypatch
):
    """digits made by scikit-learn once, kept in TULA_CACHE_DIR (group-readable as the umask
    allows), then read back identical by a fresh process that never imports scikit-learn; a
    damaged file is made again; a cache that cannot be written still gives the arrays."""
    import os
    import subprocess
    import sys

    from tula.io import current_umask
    from tula.runtime.input import builtin_sets

    monkeypatch.setenv("TULA_CACHE_DIR", str(tmp_path / "cache"))
    made = builtin_sets._make_digits(3)
    first = builtin_sets.digits(3)
    (kept,) = (tmp_path / "cache").glob("digits-seed3-sklearn*.npz")
    assert kept.stat().st_mode & 0o777 == 0o666 & ~current_umask()
    read = builtin_sets.digits(3)
    for a, b, c in zip(made, first, read):
        assert a.dtype == c.dtype and np.array_equal(a, b) and np.array_equal(a, c)
    fresh = (
        "import sys; from tula.runtime.input import builtin_sets as s; a = s.digits(3); "
        "print(len(a[0]), 'sklearn' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", fresh], capture_output=True, text=True, env=dict(os.environ)
    )
    assert out.stdout.split() == ["1437", "False"], out.stderr
    kept.write_bytes(kept.read_bytes()[:100])  # a torn file: made again, whole
    assert all(np.array_equal(a, b) for a, b in zip(made, builtin_sets.digits(3)))
    assert all(np.array_equal(a, b) for a, b in zip(made, builtin_sets.digits(3)))
    monkeypatch.setenv("TULA_CACHE_DIR", str(kept / "not-a-dir"))  # under a file: unwritable
    assert all(np.array_equal(a, b) for a, b in zip(made, builtin_sets.digits(3)))


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


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_an_npz_set_stored_channels_last_is_read_channels_first(tmp_path, dtype):
    """(n, H, W, C) images, as numpy and TensorFlow keep them (CIFAR's (n, 32, 32, 3)), were
    taken as (n, C, H, W): 32 channels of 32 x 3 images. They are now laid out channels first."""
    rng = np.random.default_rng(1)
    x = (rng.integers(0, 256, size=(24, 10, 12, 3)) + 0).astype(dtype)
    xt = (rng.integers(0, 256, size=(8, 10, 12, 3)) + 0).astype(dtype)
    path = tmp_path / "hwc.npz"
    np.savez(path, x_train=x, y_train=np.arange(24) % 2, x_test=xt, y_test=np.arange(8) % 2)
    ds = load(f"npz:{path}")
    assert ds.input_shape == (3, 10, 12)
    assert tuple(ds.train.x.shape) == (24, 3, 10, 12) and ds.train.x.is_contiguous()
    if dtype == np.uint8:  # kept as stored: sample i is x[i] with its channels first
        assert torch.equal(ds.train.x[5], torch.from_numpy(x[5].transpose(2, 0, 1).copy()))
        assert torch.equal(ds.test.x[2], torch.from_numpy(xt[2].transpose(2, 0, 1).copy()))
    else:  # standardised as it loads: the same sample up to the set's mean and std
        m, s = float(x.mean()), float(x.std())
        want = (x[5].transpose(2, 0, 1) - m) / s
        assert torch.allclose(ds.train.x[5], torch.from_numpy(want.copy()), atol=1e-5)
    # a set stored channels first is read as it is, a 3-channel image of 10 x 12
    np.savez(
        path,
        x_train=x.transpose(0, 3, 1, 2),
        y_train=np.arange(24) % 2,
        x_test=xt.transpose(0, 3, 1, 2),
        y_test=np.arange(8) % 2,
    )
    assert load(f"npz:{path}").input_shape == (3, 10, 12)


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


def test_a_uint8_set_stays_uint8_and_its_batches_are_standardised_where_they_are(tmp_path):
    """A uint8 npz set is held as uint8 (its stored bytes, for the host and the resident rule);
    each batch the device feed hands the step -- from the DataLoader, or gathered from the
    resident copy -- and each test batch the replica moves equal, within 1e-6, what the former
    host path gave (the whole set to float32, standardised once); the model's check samples
    alike."""
    import torch

    from tula import config
    from tula.runtime.input import loader
    from tula.runtime.input.data import TensorSet, WorkloadData
    from tula.runtime.input.feed import DeviceFeed

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(300, 3, 8, 8), dtype=np.uint8)
    xt = rng.integers(0, 256, size=(60, 3, 8, 8), dtype=np.uint8)
    path = tmp_path / "u8.npz"
    np.savez(path, x_train=x, y_train=np.arange(300) % 4, x_test=xt, y_test=np.arange(60) % 4)
    data = load(f"npz:{path}")
    assert data.train.x.dtype == torch.uint8 and data.test.x.dtype == torch.uint8
    assert loader.resident_bytes(data) == x.nbytes + 300 * 8  # uint8 samples, int64 labels
    # the former path: float32 on the host, standardised with float32 statistics
    x32 = x.astype(np.float32)
    mean, std = float(x32.mean()), float(x32.std())
    before = WorkloadData(
        data.name,
        TensorSet(torch.from_numpy((x32 - mean) / std), data.train.y),
        TensorSet(torch.from_numpy((xt.astype(np.float32) - mean) / std), data.test.y),
        data.num_classes,
        data.input_shape,
    )
    cpu = torch.device("cpu")
    for on_device in (False, True):
        cfg = config.from_dict(
            {"workload": {"dataset": f"npz:{path}"}, "data": {"on_device": on_device}}
        )
        got = {}
        for name, d in (("now", data), ("before", before)):
            loaders = loader.Loaders(cfg, d, 0, 1, cpu)
            ld, sampler = loaders.train(64)
            feed = DeviceFeed.of(loaders, ld, sampler, channels_last=False)
            assert feed.resident is on_device
            sampler.set_position(2, 0)
            got[name] = list(feed)
        assert len(got["now"]) == len(got["before"]) == 5
        for (a, ya), (b, yb) in zip(got["now"], got["before"]):
            assert a.dtype == b.dtype == torch.float32 and torch.equal(ya, yb)
            assert torch.allclose(a, b, rtol=0, atol=1e-6), (a - b).abs().max()
    test_batch = torch.from_numpy(xt[:16])
    assert torch.allclose(
        data.as_input(test_batch), before.test.x[:16], rtol=0, atol=1e-6
    ) and torch.equal(before.as_input(before.test.x[:16]), before.test.x[:16])
