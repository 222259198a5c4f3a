"""Checkpoint files (tula.checkpoint): the newest intact one is used, a torn, unverified or
foreign one is skipped; every part a checkpoint saves has torch's state_dict/load_state_dict."""

import ast
from pathlib import Path

import pytest
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


# -- one checkpoint protocol ---------------------------------------------------------------
SRC = Path(checkpoint.__file__).resolve().parent
OTHER_WAYS = {"state", "load", "restore", "checkpointed"}  # a second protocol's names


def saved_classes(tree: ast.AST) -> dict[str, dict[str, ast.FunctionDef]]:
    """Class name -> its methods, for every class in ``tree`` with a ``state_dict``."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            methods = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
            if "state_dict" in methods:
                found[node.name] = methods
    return found


def second_ways(methods: dict[str, ast.FunctionDef]) -> set[str]:
    """What a saved class has besides torch's protocol: no ``load_state_dict`` (nor
    ``from_state_dict``, a frozen record's), or methods of a second protocol (an optimizer's
    ``state`` property is torch's own field, not one)."""
    missing = set() if {"load_state_dict", "from_state_dict"} & set(methods) else {"no load"}
    return missing | {
        m
        for m in OTHER_WAYS & set(methods)
        if not any(ast.unparse(d) == "property" for d in methods[m].decorator_list)
    }


def test_every_part_a_checkpoint_saves_has_state_dict_and_load_state_dict():
    """torch's protocol for every saved part, Tula's own as well as torch's: ``state_dict``,
    and ``load_state_dict`` (or ``from_state_dict`` for a frozen record), and no second way."""
    classes = {
        f"{f.relative_to(SRC)}:{name}": methods
        for f in sorted(SRC.rglob("*.py"))
        for name, methods in saved_classes(ast.parse(f.read_text())).items()
    }
    parts = ("Replica", "Update", "Evaluator", "Ledger", "Position", "TulaOptimizer", "LARS")
    assert set(parts) <= {k.split(":")[1] for k in classes}, sorted(classes)
    wrong = {name: sorted(w) for name, methods in classes.items() if (w := second_ways(methods))}
    assert not wrong, wrong


@pytest.mark.parametrize(
    "body, expected",
    [
        ("def state_dict(self): ...\n    def restore(self, s): ...", {"no load", "restore"}),
        ("def state_dict(self): ...\n    def load_state_dict(self, s): ...", set()),
        ("def state_dict(self): ...\n    @property\n    def state(self): ...", {"no load"}),
    ],
)
def test_a_second_protocol_is_found(body, expected):
    (methods,) = saved_classes(ast.parse(f"class P:\n    {body}")).values()
    assert second_ways(methods) == expected
