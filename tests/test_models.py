"""Models: the shipped ones, torchvision's by name and the user's own by import path, and
`tula check`'s error for each bad model or dataset spec."""

import pytest
import torch
import yaml

from tula import config
from tula.cli import main as tula_main
from tula.runtime.nets import MODELS, build_model, check_workload


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
