"""The network registry (tula.runtime.step.nets): the shipped models, torchvision's by name and the
user's own by import path, each error naming workload.model."""

import pytest
import torch

from tula import config
from tula.runtime.step.nets import MODELS, build_model, check_workload


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 40), (3, 16, 16)])
def test_every_model_trains_one_step(name, shape):
    """One SGD step on a batch lowers the loss on that batch (the same dropout masks before
    and after), and moves every parameter whose gradient is not zero (a conv bias in front of
    batch norm gets zero, to rounding: the normalisation removes it)."""
    torch.manual_seed(0)
    m = build_model(name, shape, 10)
    x, y = torch.randn(8, *shape), torch.randint(0, 10, (8,))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def loss():
        torch.manual_seed(1)  # dropout draws the same masks each time
        return torch.nn.functional.cross_entropy(m(x), y)

    before_params = [p.detach().clone() for p in m.parameters()]
    before = loss()
    before.backward()
    opt.step()
    with torch.no_grad():
        after = loss()
    assert torch.isfinite(before) and after < before
    # BN-cancelled: ~1e-10
    grads = [p.grad is not None and bool(p.grad.abs().max() > 1e-6) for p in m.parameters()]
    moved = [not torch.equal(p.detach(), b) for p, b in zip(m.parameters(), before_params)]
    assert all(mv for mv, g in zip(moved, grads) if g) and sum(grads) >= len(grads) // 2


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
    cfg = config.from_dict(
        {
            "workload": {
                "model": "user_workload:make_model",
                "dataset": "user_workload:make_datasets",
            }
        }
    )
    w = check_workload(cfg)
    assert (w["train_samples"], w["test_samples"], w["num_classes"], w["input_shape"]) == (
        300,
        90,
        3,
        [1, 16],
    )
    assert w["parameters"] == 16 * 32 + 32 + 32 * 3 + 3
