"""Models and datasets: the shipped ones, torchvision's, image folders and the user's own by
import path; the resumable distributed sampler; and `tula check`'s error for each bad spec."""

import numpy as np
import pytest
import torch
import yaml

from tula import config, data
from tula.cli import main as tula_main
from tula.config import ConfigError
from tula.models import MODELS, build_model, check_workload


def load(dataset, **workload):
    cfg = config.from_dict({"workload": {"dataset": dataset, **workload}})
    return data.load_config(cfg)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 40), (3, 16, 16)])
def test_every_model_trains_one_step(name, shape):
    torch.manual_seed(0)
    m = build_model(name, shape, 10)
    x, y = torch.randn(8, *shape), torch.randint(0, 10, (8,))
    loss = torch.nn.functional.cross_entropy(m(x), y)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in m.parameters())


@pytest.mark.parametrize("name", ["tv_resnet18", "tv_vgg11", "tv_mobilenet_v3_large"])
def test_paper_families_from_torchvision_by_name(name):
    m = build_model(name, (3, 32, 32), 7)
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 7)


def test_torchvision_errors_name_the_key():
    with pytest.raises(ValueError, match="workload.model.*no classification model 'resnet9000'"):
        build_model("tv_resnet9000", (3, 32, 32), 10)
    with pytest.raises(ValueError, match="workload.model.*3-channel images"):
        build_model("tv_resnet18", (1, 8, 8), 10)


def test_unknown_model_names_the_key():
    with pytest.raises(ValueError, match="workload.model"):
        build_model("resnet9000", (1, 8, 8), 10)


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


def test_user_model_and_dataset_by_import_path(user_pythonpath):
    cfg = config.from_dict({"workload": {"model": "user_workload:make_model", "dataset": "user_workload:make_datasets"}})
    w = check_workload(cfg)
    assert (w["train_samples"], w["test_samples"], w["num_classes"], w["input_shape"]) == (300, 90, 3, [1, 16])
    assert w["parameters"] == 16 * 32 + 32 + 32 * 3 + 3


@pytest.mark.parametrize("key, spec, message", [
    ("model", "no_such_package.models:build", "workload.model.*cannot import module 'no_such_package.models'"),
    ("model", "user_workload:missing", "workload.model.*has no attribute 'missing'"),
    ("model", "user_workload:NOT_CALLABLE", "workload.model.*is a int, not a callable"),
    ("model", "user_workload:returns_a_string", "workload.model.*returned a str, not a torch.nn.Module"),
    ("model", "user_workload:wrong_output", r"workload.model.*\(batch, num_classes\) = \(2, 3\).*got \(2, 4\)"),
    ("model", "tv_resnet18", r"workload.model.*3-channel images"),
    ("dataset", "no_such_package:data", "workload.dataset.*cannot import module"),
    ("dataset", "user_workload:returns_one_dataset", r"workload.dataset.*must return \(train_dataset, test_dataset\)"),
    ("dataset", "user_workload:yields_dicts", r"workload.dataset.*must be \(tensor, int\); got dict"),
    ("dataset", "npz:/no/such/file.npz", "workload.dataset.*npz file /no/such/file.npz not found"),
    ("dataset", "imagefolder:/no/such/dir", "workload.dataset.*image folder /no/such/dir/train not found"),
])  # fmt: skip
def test_tula_check_names_each_bad_model_or_dataset(tmp_path, user_pythonpath, capsys, key, spec, message):
    good = {"model": "user_workload:make_model", "dataset": "user_workload:make_datasets"}
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"workload": {**good, key: spec}}))
    assert tula_main(["check", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tula check: error: ") and __import__("re").search(message, err), err


def test_image_folder_layout_errors(tmp_path):
    (tmp_path / "a" / "train" / "cat").mkdir(parents=True)
    (tmp_path / "a" / "val").mkdir(parents=True)
    with pytest.raises(ConfigError, match="val has no class folders"):
        load(f"imagefolder:{tmp_path / 'a'}")


# -- order and position ---------------------------------------------------------------------


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
