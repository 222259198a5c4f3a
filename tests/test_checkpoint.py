"""Checkpoint files (tula.checkpoint): the newest intact one is used, a torn, unverified or
foreign one is skipped."""

import torch

from conftest import checkpoint_state
from tula import checkpoint


def test_checkpoints_keep_the_newest_two_and_skip_damaged_ones(tmp_path):
    for step in (5, 10, 15):
        checkpoint.save(tmp_path, checkpoint_state(step), step, keep=2)
    assert [s for s, _ in checkpoint.manifests(tmp_path)] == [15, 10]
    assert not (tmp_path / "step-000000005.pt").exists()
    checkpoint.truncate(tmp_path / "step-000000015.pt")
    loaded, warnings = checkpoint.load_latest(tmp_path)
    assert loaded.step == 10 and torch.equal(loaded.state["w"], torch.full((3,), 10.0))
    assert len(warnings) == 1 and "truncated" in warnings[0]
    assert checkpoint.newest_intact(tmp_path) == 10


def test_checkpoint_without_manifest_or_of_another_run_is_not_used(tmp_path):
    checkpoint.save(tmp_path, checkpoint_state(1), 5)
    checkpoint.save(tmp_path, checkpoint_state(2), 10)
    (tmp_path / "step-000000010.json").unlink()  # the write was interrupted before its manifest
    loaded, _ = checkpoint.load_latest(tmp_path)
    assert loaded.step == 5
    loaded, warnings = checkpoint.load_latest(
        tmp_path, accept=lambda s: "other run" if s["fingerprint"] != "g" else ""
    )
    assert loaded is None and "other run" in warnings[0]
    (tmp_path / "step-000000005.pt").write_bytes(
        b"x" * (tmp_path / "step-000000005.pt").stat().st_size
    )
    loaded, warnings = checkpoint.load_latest(tmp_path)
    assert loaded is None and "SHA-256" in warnings[0]
