"""The production job running a user's own script (examples/ddp_train/train.py) through `tula
launch` (submitit's local executor, 2 gloo processes): its records, a requeue signal mid-epoch
resumed bitwise, and an out-of-memory error relaunched at the next smaller batch from the last
checkpoint (a stop's checkpoint and a launch again are Tula's own stops.stop and launcher,
tests/production/test_launcher.py's)."""

import json
import math

import pandas as pd
import pytest
import yaml

from conftest import ROOT, bitwise_equal, load_params, train_from_files, venv_env
from selections import selection_json
from tula import faults
from tula.io import write_json

EXAMPLE = ROOT / "examples" / "ddp_train" / "train.py"
ARGS = "--batch-size {local_batch} --lr {lr} --epochs {epochs} --samples 2000".split()
TRAIN = 1600  # MNIST-1D's training samples of 2,000
STEPS1 = math.ceil(TRAIN / 2 / 32)  # steps an epoch at B = 64 over 2 workers (25)


def _run_dir(d, script=EXAMPLE, args=ARGS, batch=64):
    raw = {
        "workload": {"script": str(script), "args": args, "epochs": 2},
        "grid": {"workers": [1, 2], "batch_min": 32, "batch_max": 128},
        "launch": {"checkpoint_every_steps": 5, "poll_s": 0.5, "executor": "local"},
    }
    (d / "config.yaml").write_text(yaml.safe_dump(raw))
    write_json(d / "selection.json", selection_json(2, batch))
    return d


def _launch(d, out="train"):
    return train_from_files(d / "config.yaml", d / "selection.json", d / out)


def _attempts(d, out="train"):
    return json.loads((d / out / "attempts.json").read_text())


@pytest.fixture(scope="module")
def script_reference(tmp_path_factory):
    """An uninterrupted run of the example, made once for the tests that compare with it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", venv_env()["PATH"])
        d = _run_dir(tmp_path_factory.mktemp("reference"))
        final = _launch(d, "ref")
    return d / "ref", final


@pytest.mark.training
def test_the_scripts_production_job_keeps_tulas_records(script_reference):
    out, final = script_reference
    assert final["workload"] == "script" and final["script"] == str(EXAMPLE)
    assert final["steps"] == 2 * STEPS1 and final["train_samples"] == TRAIN
    assert final["workers"] == 2 and final["global_batch"] == 64 and final["mean_step_time_s"] > 0
    assert final["parts_kept"] == {
        "model": "DistributedDataParallel",
        "optimizer": "SGD",
        "scheduler": "MultiStepLR",
    }
    m = pd.read_csv(out / "metrics.csv")
    assert list(m["epoch"]) == [1, 2] and list(m["step"]) == [STEPS1, 2 * STEPS1]
    assert m["test_acc"].between(0.2, 1).all() and final["final_test_acc"] == m["test_acc"].iloc[-1]
    assert final["eval_time_s"] > 0 and final["checkpoint_time_s"] > 0  # between epochs, saves
    assert (out / "model.pt").exists() and any((out / "tensorboard").iterdir())
    (att,) = _attempts(out.parent, "ref")["attempts"]
    assert att["outcome"] == "completed"


@pytest.mark.training
def test_a_requeue_signal_mid_epoch_resumes_bitwise(
    script_reference, tmp_path, monkeypatch, venv_path
):
    ref_dir, _ = script_reference
    d = _run_dir(tmp_path)
    monkeypatch.setenv(faults.ENV, f"signal:step={STEPS1 + 7},sig=USR2")  # epoch 2's 8th step
    _launch(d)
    (att,) = _attempts(d)["attempts"]
    assert att["outcome"] == "completed"
    assert [(s["start_step"], s["end_step"], s["outcome"]) for s in att["segments"]] == [
        (0, STEPS1 + 7, "requeued"),
        (STEPS1 + 7, 2 * STEPS1, "completed"),
    ]
    assert bitwise_equal(load_params(d / "train" / "model.pt"), load_params(ref_dir / "model.pt"))
    cols = ["epoch", "step", "test_loss", "test_acc"]
    m, r = pd.read_csv(d / "train" / "metrics.csv"), pd.read_csv(ref_dir / "metrics.csv")
    assert m[cols].equals(r[cols])


OOM_SCRIPT = """\
import sys
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import tula.script

run = tula.script.attach(int(sys.argv[1]), epochs=2)
dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 8), torch.randint(0, 3, (512,)))
sampler = DistributedSampler(data, seed=0)
loader = DataLoader(data, batch_size=run.local_batch, sampler=sampler)
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run.keep(model=model, optimizer=opt)


@run.step
def step(x, y):
    if run.local_batch > 16 and run.walk.steps_done == 7 and run.rank == 1:
        raise torch.OutOfMemoryError("CUDA out of memory (the test's, at b > 16)")
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


for epoch in run.epochs():
    sampler.set_epoch(epoch)
    for x, y in run.batches(loader):
        step(x, y)
    run.epoch_end(loss=0.0)
"""


@pytest.mark.training
def test_out_of_memory_in_the_scripts_step_relaunches_smaller_from_the_checkpoint(
    tmp_path, venv_path
):
    script = tmp_path / "oom_train.py"
    script.write_text(OOM_SCRIPT)
    d = _run_dir(tmp_path, script, ["{local_batch}"])
    final = _launch(d)
    att = _attempts(d)["attempts"]
    assert [(a["global_batch"], a["outcome"]) for a in att] == [(64, "oom"), (32, "completed")]
    assert "out of memory in training step 8" in att[0]["reason"]
    assert att[1]["start_step"] == 5  # the last checkpoint (every 5 steps) before step 8
    # 5 steps of 64 samples stand for 10 of 32: the relaunch goes on with the next unseen ones
    assert final["global_batch"] == 32 and final["steps"] == 5 + (512 // 32 - 10) + 512 // 32


LIGHTNING = ROOT / "examples" / "lightning_train" / "train.py"


@pytest.mark.training
def test_a_lightning_script_is_trained_checkpointed_requeued_and_resumed(
    tmp_path, monkeypatch, venv_path
):
    """examples/lightning_train: Tula's callback in Lightning's own fit loop (DDP, 2 gloo
    processes). A USR2 mid-epoch: the callback's step checkpoints (Lightning's own state
    inside Tula's checkpoint), submitit requeues, and fit resumes from it (ckpt_path)."""
    d = _run_dir(tmp_path, LIGHTNING)
    monkeypatch.setenv(faults.ENV, f"signal:step={STEPS1 + 7},sig=USR2")
    final = _launch(d)
    (att,) = _attempts(d)["attempts"]
    assert att["outcome"] == "completed"
    assert [s["outcome"] for s in att["segments"]] == ["requeued", "completed"]
    assert att["segments"][1]["start_step"] == STEPS1 + 7
    assert final["parts_kept"] == {"lightning": "LightningState"}
    m = pd.read_csv(d / "train" / "metrics.csv")
    assert list(m["epoch"]) == [1, 2] and m["test_acc"].notna().all()  # Lightning's val_acc
    assert final["steps"] >= 2 * STEPS1 and final["mean_step_time_s"] > 0
