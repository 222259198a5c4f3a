"""The one training step and the trainer: image folders through DataLoader workers, bitwise
resume with loader workers and random augmentation, bf16 and fp16 with AGS on unscaled
gradients. Real runs: `tula launch` with submitit's local executor, 2 gloo processes."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

import bounds
from bounds import check_accuracy
from conftest import (
    bitwise_equal,
    digits_uint8,
    load_params,
    make_image_folder,
    train_from_files,
    venv_env,
)
from selections import selection_json
from tula import faults
from tula.io import write_json
from tula.model.grid import steps_per_epoch
from tula.production import trainer

F1 = "torchmetrics.classification:MulticlassF1Score"


def _run_dir(tmp_path, raw, workers=2, batch=32):
    raw.setdefault("launch", {}).update(executor="local", poll_s=0.5, checkpoint_every_steps=4)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    write_json(tmp_path / "selection.json", selection_json(workers, batch))
    return tmp_path


def _launch(d, out="train"):
    return train_from_files(d / "config.yaml", d / "selection.json", d / out)


@pytest.fixture
def folder_run(tmp_path, image_folder, venv_path):
    return _run_dir(tmp_path, _folder_raw(image_folder))


@pytest.fixture(scope="module")
def folder_reference(tmp_path_factory):
    """An uninterrupted run of folder_run's configuration (its own image folder, written the
    same way), made once: the first test checks it, the requeue test resumes against it."""
    d = tmp_path_factory.mktemp("folder")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", venv_env()["PATH"])
        run = _run_dir(d, _folder_raw(make_image_folder(d / "images")))
        return run, _launch(run, "ref")


def _folder_raw(image_folder):
    return {
        "workload": {
            "model": "small_cnn",
            "dataset": f"imagefolder:{image_folder}",
            "epochs": 3,
            "seed": 1,
        },
        "data": {
            "image_size": 16,
            "train_augment": "crop_flip",
            "num_workers": 2,
            "eval_batch_size": 16,
        },
        "train": {"lr": 0.05},
    }


def test_image_folder_trains_with_two_gloo_and_two_loader_workers(folder_reference):
    run, final = folder_reference
    assert (final["workers"], final["data_workers"], final["train_samples"]) == (2, 2, 120)
    assert final["steps"] == 3 * math.ceil(120 / 32)
    m = pd.read_csv(run / "ref" / "metrics.csv")
    assert m["train_loss"].iloc[-1] < m["train_loss"].iloc[0]
    # 10 classes of coloured stripes (chance 0.1): the best epoch as recorded (tests/bounds.py)
    check_accuracy("trainer image folder, best epoch", final["best_test_acc"])


@pytest.mark.training
def test_requeue_resume_is_bitwise_equal_with_loader_workers_and_augmentation(
    folder_run, folder_reference, monkeypatch
):
    ref_run, ref = folder_reference
    monkeypatch.setenv(faults.ENV, "signal:step=6,sig=TERM")  # mid-epoch 2 (4 steps per epoch)
    with pytest.raises(RuntimeError, match="was stopped"):
        _launch(folder_run)
    monkeypatch.delenv(faults.ENV)
    final = _launch(folder_run)  # resumes from the step-7 stop checkpoint
    att = json.loads((folder_run / "train" / "attempts.json").read_text())["attempts"]
    assert [a["outcome"] for a in att] == ["stopped", "completed"] and att[1]["start_step"] == 7
    assert final["steps"] == ref["steps"]
    assert bitwise_equal(
        load_params(folder_run / "train" / "model.pt"), load_params(ref_run / "ref" / "model.pt")
    )


@pytest.mark.training
def test_bf16_adamw_onecycle_trains_and_resumes_bitwise(tmp_path, tiny_raw, venv_path, monkeypatch):
    """bf16, AdamW under AGS (which scales its update), OneCycleLR, a macro-F1 over the epoch
    (torchmetrics) and an EMA of the weights: stopped at step 9, mid-epoch, and resumed from
    its checkpoint (model, optimizer, AGS, schedule, scaler, RNG, position, the F1's states,
    the EMA and ledger, each its owner's state_dict), the run ends bit for bit as the one never
    stopped, its EMA's weights and its epochs' F1s too; the EMA's F1 is reported beside the
    weights'.
    Its TensorBoard curves, read back with tensorboard's own reader, have every step once,
    the resumed attempt's replacing what the stopped one logged after its checkpoint."""
    tiny_raw["train"].update(precision="bf16", optimizer="adamw", schedule="onecycle", lr=0.01)
    tiny_raw["train"].update(method="ags")  # named: auto would train AdamW plainly
    tiny_raw["train"].update(metric=F1, metric_args={"num_classes": 10, "average": "macro"})
    tiny_raw["train"].update(ema_decay=0.9)
    d = _run_dir(tmp_path, tiny_raw, batch=64)
    ref = _launch(d, "ref")
    assert ref["precision"] == "bf16"
    check_accuracy("trainer bf16 AdamW OneCycle AGS", ref["final_test_acc"])
    assert ref["optimizer"] == "adamw" and ref["schedule"] == "onecycle" and ref["ags"]["scaled"]
    monkeypatch.setenv(faults.ENV, "signal:step=9,sig=TERM")
    with pytest.raises(RuntimeError, match="was stopped"):
        _launch(d)
    monkeypatch.delenv(faults.ENV)
    final = _launch(d)
    assert final["steps"] == ref["steps"]
    for weights in ("model.pt", "model_ema.pt"):
        assert bitwise_equal(load_params(d / "train" / weights), load_params(d / "ref" / weights))
    ema = load_params(d / "train" / "model_ema.pt")
    assert not bitwise_equal(ema, load_params(d / "train" / "model.pt"))
    assert final["final_test_acc_ema"] <= 1.0
    check_accuracy("trainer bf16 AdamW OneCycle AGS, its EMA", final["final_test_acc_ema"])
    rows = final_rows(d)  # the EMA's F1 beside the weights', each epoch and at the end
    assert rows[-1]["test_acc_ema"] == final["final_test_acc_ema"] == ref["final_test_acc_ema"]
    assert any(r["test_acc_ema"] != r["test_acc"] for r in rows)
    assert len(list((d / "train" / "tensorboard").glob("events.out.tfevents.*"))) == 2
    curves = tensorboard_scalars(d / "train" / "tensorboard")
    ref_curves = tensorboard_scalars(d / "ref" / "tensorboard")
    steps = list(range(1, final["steps"] + 1))
    for tag in ("train/loss", "train/lr", "time/step_s", "time/samples_per_s", "ags/scaled_share"):
        assert [s for s, _ in curves[tag]] == steps, tag
    # the same steps, the same losses and LR: the resumed run's curves are the unstopped one's
    for tag in (
        "train/loss",
        "train/lr",
        *(f"epoch/{k}_MulticlassF1Score" for k in ("train", "test")),
    ):
        assert curves[tag] == ref_curves[tag], tag
    assert [s for s, _ in curves["epoch/test_MulticlassF1Score"]] == [
        r["step"] for r in final_rows(d)
    ]
    assert {"ags/mean_factor", "epoch/test_loss", "epoch/test_MulticlassF1Score_ema"} <= set(curves)


@pytest.mark.training
def test_a_users_loss_and_metric_run_end_to_end(tmp_path, tiny_raw, venv_path, user_pythonpath):
    """The user's model, data, loss and metric (tests/user_workload.py): the config check runs
    the loss and the metric on real samples, two workers train with them, and final.json,
    metrics.csv, the curves and the terminal's answer carry the metric under its own name,
    its best the smallest (metric_goal: min); no chance warning, which is accuracy's."""
    from tula.stages import check, summary

    tiny_raw["workload"].update(
        model="user_workload:make_model", dataset="user_workload:make_datasets"
    )
    tiny_raw["train"].update(
        loss="user_workload:margin_loss", metric="user_workload:error_rate", metric_goal="min"
    )
    d = _run_dir(tmp_path, tiny_raw, batch=30)
    w = check.run(d / "config.yaml")
    assert w["training"]["loss"] == "user_workload:margin_loss"
    final = _launch(d)
    assert (final["metric"], final["metric_goal"]) == ("user_workload:error_rate", "min")
    errors = pd.read_csv(d / "train" / "metrics.csv")["test_acc"].tolist()
    assert final["best_test_acc"] == min(errors) and final["final_test_acc"] == errors[-1]
    # three well-apart blobs: chance is two in three wrong; the run is judged against its own
    check_accuracy("trainer user loss and metric, 1 - error", 1 - errors[-1])
    curves = tensorboard_scalars(d / "train" / "tensorboard")
    assert [v for _, v in curves["epoch/test_error_rate"]] == pytest.approx(errors)
    line = summary._metric_line(final)
    assert line.startswith("error_rate: ") and "%" not in line


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar curve in ``log_dir``, read with tensorboard's own EventAccumulator (which
    drops what a resumed writer's purge_step replaces): tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def final_rows(d: Path) -> list[dict]:
    return pd.read_csv(d / "train" / "metrics.csv").to_dict(orient="records")


# -- the step itself, in this process (a one-process gloo group) ---------------------------


@pytest.mark.training
def test_two_process_training(tiny_raw, tmp_path, venv_path):
    """digits stored as uint8 images (tests/conftest.py's digits_uint8): the batches are
    standardised once, on the device, and the model learns what the float set's does."""
    tiny_raw["workload"]["dataset"] = f"npz:{digits_uint8(tmp_path / 'digits_u8.npz')}"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tiny_raw))
    sel = tmp_path / "selection.json"
    write_json(sel, selection_json(2, 64))
    final = train_from_files(
        tmp_path / "config.yaml", sel, tmp_path / "train", executor_hint="local"
    )
    m = pd.read_csv(tmp_path / "train" / "metrics.csv")
    assert list(m["epoch"]) == [1, 2] and list(m.columns) == trainer.METRIC_COLUMNS
    assert final["steps"] == 2 * steps_per_epoch(1437, 64)
    assert m["train_loss"].iloc[-1] < m["train_loss"].iloc[0]
    # digits as uint8, 2 epochs: what this run reaches, recorded (tests/bounds.py); standardised
    # twice, it ends near chance (0.10)
    check_accuracy("trainer uint8 digits N2 B64", final["final_test_acc"])
    # time is reported apart: training steps, the first step at each shape (the full batch and
    # the epoch's short last one, 1437 % 64 = 29: two), evaluation, checkpoints, process start-up
    assert final["first_steps"] == 2 and final["first_steps_time_s"] > 0
    assert final["mean_step_time_s"] == pytest.approx(final["train_time_s"] / (final["steps"] - 2))
    assert all(
        final[k] > 0 for k in ("train_time_s", "eval_time_s", "checkpoint_time_s", "startup_time_s")
    )
    assert m["epoch_time_s"].sum() == pytest.approx(
        final["train_time_s"] + final["first_steps_time_s"], abs=1e-6
    )
    # the job's wall time, from its process's start: every part above, and a little besides
    parts = sum(
        final[k]
        for k in (
            "train_time_s",
            "first_steps_time_s",
            "eval_time_s",
            "checkpoint_time_s",
            "startup_time_s",
        )
    )
    assert parts < final["wall_time_s"] < parts + bounds.UNTIMED_S
    # the gradient noise scale of each epoch, from AGS's refresh at its first step (reference
    # sub-batch
    # ags_small_batch against B): one pair an epoch, |G|^2 and tr(Sigma) recorded as measured
    assert m["grad_sq"].notna().all() and m["grad_trace"].notna().all()
    ok = m[(m["grad_sq"] > 0) & (m["grad_trace"] > 0)]
    assert (ok["grad_noise_scale"] == ok["grad_trace"] / ok["grad_sq"]).all()
    assert m.loc[~m.index.isin(ok.index), "grad_noise_scale"].isna().all()


@pytest.mark.training
def test_training_failure_raises_and_writes_no_final(tiny_raw, tmp_path, venv_path):
    import yaml

    tiny_raw["workload"]["dataset"] = f"npz:{tmp_path / 'missing.npz'}"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw))
    sel = tmp_path / "selection.json"
    write_json(sel, selection_json(1, 32))
    previous = tmp_path / "train" / "final.json"
    write_json(previous, {"from": "an earlier good run"})
    with pytest.raises(
        RuntimeError, match="training at N=1 B=32 failed.*workload.dataset.*missing.npz not found"
    ):
        train_from_files(cfg, sel, tmp_path / "train", executor_hint="local")
    assert json.loads(previous.read_text()) == {"from": "an earlier good run"}  # nothing lost


@pytest.fixture
def single_worker():
    """This process as a job's only worker: the environment `tula.runtime.group.dist.init` changes,
    restored, and its process group (gloo, world 1) destroyed, after the test."""
    import os

    import torch.distributed as torch_dist

    saved = dict(os.environ)
    for key in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        os.environ.pop(key, None)
    try:
        yield
    finally:
        if torch_dist.is_initialized():
            torch_dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved)


def test_the_trainer_keeps_no_config_section(tiny_raw, tmp_path, single_worker):
    """The trainer reads what its phases ask of the config as it is built (the settings
    final.json echoes, the epochs, the monitor's launch.*): no field of it holds the config
    or a section, so a phase depends on what the trainer was given."""
    from tula import config

    tiny_raw["launch"] = {"replan": "off", "monitor_every_steps": 7}
    cfg = config.from_dict(tiny_raw)
    t = trainer.Trainer(cfg, 1, 32, tmp_path)
    held = [k for k, v in vars(t).items() if type(v).__module__ == "tula.config"]
    assert held == [] and t.epochs == cfg.workload.epochs
    assert t.settings["method"] == cfg.train.method and t.settings["model"] == cfg.workload.model
    assert t.monitor_every is None and t.replan == "off"  # replan off: no monitor pairs
    cfg = config.from_dict({**tiny_raw, "launch": {"replan": "move", "monitor_every_steps": 7}})
    assert trainer.Trainer(cfg, 1, 32, tmp_path).monitor_every == 7
