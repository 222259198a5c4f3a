"""train.metric as a torchmetrics metric (tula.runtime.train.loss_metric.EpochMetric): computed
over the whole test set and synced across two real gloo ranks, a macro-F1 is scikit-learn's
macro-F1 of the same predictions, where the per-batch mean Tula used to take is not; a checkpoint
keeps its states and a run at another N merges them; the step a monitor undoes leaves them as they
were."""

import json

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp
from sklearn.metrics import f1_score

import bounds
from tula import config
from tula.runtime.step.replica import Replica
from tula.runtime.train import loss_metric

F1 = "torchmetrics.classification:MulticlassF1Score"


def _imbalanced_npz(path) -> None:
    """8x8 images whose class moves their mean, imbalanced: 70 % class 0, 0.5 % class 8."""
    rng = np.random.default_rng(0)
    shares = np.array([0.70, 0.10, 0.06, 0.04, 0.03, 0.025, 0.02, 0.01, 0.005, 0.02])
    y = rng.choice(10, size=557, p=shares / shares.sum())
    x = rng.normal(size=(557, 8, 8)).astype(np.float32) + y[:, None, None] * 0.5
    np.savez(path, x_train=x[:256], y_train=y[:256], x_test=x[256:], y_test=y[256:])


def _cfg(npz: str, metric: str = F1, args=None) -> config.Config:
    args = {"num_classes": 10, "average": "macro"} if args is None else args
    return config.from_dict(
        {
            "workload": {"model": "small_cnn", "dataset": f"npz:{npz}", "epochs": 1},
            "data": {"eval_batch_size": 16, "num_workers": 0},
            "train": {"metric": metric, "metric_args": args, "method": "lbt", "lr": 0.1},
        }
    )


def _ranks(rank: int, world: int, store: str, npz: str, out: str) -> None:
    torch_dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world
    )
    torch.manual_seed(0)
    replica = Replica(_cfg(npz), torch.device("cpu"), 32, rank, world)
    for _ in range(3):  # three epochs: predictions of more than one class
        batches = replica.walk.epoch_batches()
        while not replica.walk.epoch_over():
            replica.walk.run_step(batches)
        _, train_f1, _ = replica.walk.end_epoch()
    _, f1 = replica.evaluate()
    got = {"f1": f1, "train_f1": train_f1}
    # each rank's predictions on its own shard (r, r + N, ...), with its own weights (its
    # batch-norm statistics are its last step's), as evaluation made them
    with torch.no_grad(), replica.autocast():
        x, y = replica.to_device(replica.data.test.x, replica.data.test.y)
        got["pred"] = replica.ddp.module.eval()(x[rank::world]).argmax(1).tolist()
        got["y"] = y[rank::world].tolist()
    torch_dist.barrier()
    torch_dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as fh:
        json.dump(got, fh)


@pytest.mark.slow
@pytest.mark.training
def test_a_macro_f1_over_two_ranks_is_scikit_learns_on_the_same_predictions(tmp_path):
    npz, out = tmp_path / "imbalanced.npz", str(tmp_path / "got")
    _imbalanced_npz(npz)
    mp.spawn(_ranks, args=(2, str(tmp_path / "store"), str(npz), out), nprocs=2, join=True)
    r0, r1 = (json.loads(open(f"{out}.{r}").read()) for r in (0, 1))
    # synced: both ranks hold the whole set's value, and the training epoch's
    assert (r0["f1"], r0["train_f1"]) == (r1["f1"], r1["train_f1"])
    y, pred = r0["y"] + r1["y"], r0["pred"] + r1["pred"]
    want = f1_score(y, pred, average="macro")
    assert abs(r0["f1"] - want) <= 1e-6
    assert len(set(pred)) > 1  # not a constant predictor, where every F1 agrees
    # each rank's own macro-F1, or the mean of per-batch ones, is another number
    assert abs(f1_score(r0["y"], r0["pred"], average="macro") - want) > bounds.ROUNDING
    batches = [
        f1_score(y[i : i + 16], pred[i : i + 16], average="macro") for i in range(0, 301, 16)
    ]
    assert abs(np.mean(batches) - want) > bounds.ROUNDING


def test_the_states_are_checkpointed_merged_at_another_n_and_put_back(tmp_path):
    """Two ranks' halves of an epoch: their saved states merged into one metric (a run
    resumed at N = 1) give the whole epoch's value; a bad argument names metric_args."""
    t = _cfg(str(tmp_path / "none.npz")).train
    g = torch.Generator().manual_seed(1)
    out, y = torch.randn(64, 10, generator=g), torch.randint(0, 3, (64,), generator=g)
    whole, halves = (
        loss_metric.build_metric(t),
        [loss_metric.build_metric(t), loss_metric.build_metric(t)],
    )
    assert isinstance(whole, loss_metric.EpochMetric)
    whole(out, y)
    for k, half in enumerate(halves):
        assert half(out[k::2], y[k::2]).item() == 0.0  # nothing in the epoch's sums
    resumed = loss_metric.build_metric(t)
    resumed.load_state_dict([h.state_dict() for h in halves])
    want = f1_score(y, out.argmax(1), average="macro", labels=list(range(10)), zero_division=0)
    assert resumed.compute() == pytest.approx(whole.compute(), abs=1e-7)
    assert abs(halves[0].compute() - want) > bounds.ROUNDING  # a half alone is not the epoch
    saved = halves[1].state_dict()
    halves[1](out, y)  # a step the monitor undoes
    halves[1].load_state_dict([saved])
    assert {k: v.tolist() for k, v in halves[1].state_dict().items()} == {
        k: v.tolist() for k, v in saved.items()
    }
    with pytest.raises(config.ConfigError, match="train.metric_args"):
        loss_metric.build_metric(_cfg("x.npz", args={"num_klasses": 3}).train)
    with pytest.raises(config.ConfigError, match="train.metric_args"):
        loss_metric.build_metric(
            _cfg("x.npz", metric="tula.runtime.train.loss_metric:build_loss").train
        )
