import re

import numpy as np
import pytest
import torch

from tula import config
from tula.config import ConfigError
from tula.data import load_dataset
from tula.models import MODELS, build_model


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 40), (3, 16, 16)])
def test_every_model_trains_one_step(name, shape):
    torch.manual_seed(0)
    m = build_model(name, shape, 10)
    x, y = torch.randn(8, *shape), torch.randint(0, 10, (8,))
    loss = torch.nn.functional.cross_entropy(m(x), y)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in m.parameters())


def test_schema_accepts_every_registered_model():
    pattern = config.schema()["properties"]["workload"]["properties"]["model"]["pattern"]
    assert all(re.match(pattern, n) for n in MODELS)


def test_unknown_model_names_the_key():
    with pytest.raises(ValueError, match="workload.model"):
        build_model("resnet9000", (1, 8, 8), 10)


def test_digits_split_and_standardisation():
    ds = load_dataset("digits", seed=0)
    assert ds.input_shape == (1, 8, 8) and ds.num_classes == 10
    assert ds.train_size == 1437 and len(ds.x_test) == 360
    assert abs(float(ds.x_train.mean())) < 1e-4


def test_mnist1d_generated_locally():
    ds = load_dataset("mnist1d", mnist1d_samples=500, seed=1)
    assert ds.input_shape == (1, 40) and ds.train_size == 400 and ds.num_classes == 10


def test_npz_dataset_and_its_errors(tmp_path):
    rng = np.random.default_rng(0)
    good = tmp_path / "d.npz"
    np.savez(good, x_train=rng.normal(size=(20, 12, 12)), y_train=np.arange(20) % 3,
             x_test=rng.normal(size=(6, 12, 12)), y_test=np.arange(6) % 3)  # fmt: skip
    ds = load_dataset(f"npz:{good}")
    assert ds.input_shape == (1, 12, 12) and ds.num_classes == 3
    with pytest.raises(ConfigError, match="not found"):
        load_dataset(f"npz:{tmp_path / 'none.npz'}")
    bad = tmp_path / "bad.npz"
    np.savez(bad, x_train=np.zeros((4, 5)), y_train=np.zeros(4, dtype=int))
    with pytest.raises(ConfigError, match="missing array.*x_test"):
        load_dataset(f"npz:{bad}")
    labels = tmp_path / "labels.npz"
    np.savez(labels, x_train=np.zeros((4, 5)), y_train=np.zeros(3, dtype=int), x_test=np.zeros((2, 5)),
             y_test=np.zeros(2, dtype=int))  # fmt: skip
    with pytest.raises(ConfigError, match="y_train must be 1-D with one label per row"):
        load_dataset(f"npz:{labels}")
