"""tula.io: atomic writes that the user's group can read."""

import json
import os
import stat

import pandas as pd
import pytest

from tula import checkpoint
from tula.io import atomic_write, current_umask, write_bytes, write_csv, write_json


@pytest.fixture
def umask():
    def set_(mask: int) -> None:
        os.umask(mask)

    old = os.umask(0o022)
    os.umask(old)
    yield set_
    os.umask(old)


@pytest.mark.parametrize(
    "mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600), (0o002, 0o664)]
)
def test_results_and_checkpoints_get_the_mode_the_umask_gives(tmp_path, umask, mask, mode):
    umask(mask)
    assert current_umask() == mask
    write_json(tmp_path / "selection.json", {"a": 1})
    write_csv(tmp_path / "predictions.csv", pd.DataFrame({"a": [1]}))
    write_bytes(tmp_path / "report.html", b"<html></html>")
    checkpoint.save(tmp_path / "checkpoints", {"model": {}, "epoch": 1}, step=10)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 5  # no temporary file left behind
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: mode for p in files}


def test_a_rewrite_keeps_being_atomic_and_readable(tmp_path, umask):
    umask(0o022)
    target = tmp_path / "measurements.csv"
    write_csv(target, pd.DataFrame({"a": [1]}))
    write_csv(target, pd.DataFrame({"a": [2]}))
    assert target.read_text() == "a\n2\n" and stat.S_IMODE(target.stat().st_mode) == 0o644


def test_atomic_write_keeps_old_file_on_error(tmp_path):
    target = tmp_path / "selection.json"
    write_json(target, {"v": 1})
    with pytest.raises(RuntimeError):
        with atomic_write(target) as fh:
            fh.write('{"v": 2, "half')
            raise RuntimeError("crash mid-write")
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["selection.json"]


def test_write_json_nan_becomes_null(tmp_path):
    write_json(tmp_path / "x.json", {"a": float("nan")})
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": None}
