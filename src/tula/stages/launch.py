"""``tula launch``: train at the selected (N, B) until done, through the production job's
launcher (:mod:`tula.production.launcher`: submitit, requeues, the relaunch after an OOM,
the re-plan on drift), and say where the results are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tula import config as config_mod
from tula.io import read_json
from tula.production.launcher import train


def selected_point(path) -> tuple[int, int]:
    """(workers, global_batch) of a selection.json; the error names the file."""
    sel = read_json(path)
    try:
        return int(sel["selected"]["workers"]), int(sel["selected"]["global_batch"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"{path}: no selected.workers / selected.global_batch; re-run `tula select`"
        ) from None


def run(
    cfg_path: str | Path,
    selection: str | Path,
    out_dir: str | Path,
    predictions: str | Path | None = None,
    executor_hint: str | None = None,
    timeout_min: int | None = None,
    partition: str | None = None,
    account: str | None = None,
    fresh: bool = False,
) -> dict[str, Any]:
    """``tula launch``: final.json of the production job at the selected point (the config and
    selection.json read here; the launcher takes them as records)."""
    final = train(
        config_mod.load(cfg_path),
        selected_point(selection),
        out_dir,
        predictions,
        executor_hint,
        timeout_min,
        partition,
        account,
        fresh,
    )
    print(
        f"[launch] done: N={final['workers']} B={final['global_batch']}, test accuracy "
        f"{100 * final['final_test_acc']:.2f}% -> {out_dir}/ (final.json, metrics.csv, model.pt, "
        "attempts.json)"
    )
    return final
