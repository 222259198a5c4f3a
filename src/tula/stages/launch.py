"""``tula launch``: train at the selected (N, B) until done, through the production job's
launcher (:mod:`tula.production.launcher`: submitit, requeues, the relaunch after an OOM,
the re-plan on drift), and say where the results are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tula import config as config_mod
from tula import partitions
from tula.io import write_json
from tula.model import across
from tula.model.selection import Selection
from tula.production.launcher import train
from tula.production.submission import resolve_executor
from tula.slurm import queue as slurm_queue


def selected_point(path) -> tuple[int, int]:
    """(workers, global_batch) of a selection.json; the error names the file and what to do."""
    try:
        return Selection.read(path).point
    except ValueError as err:
        raise ValueError(f"{err}; re-run `tula select`") from None


def queue_again(cfg, selection: str | Path, out_dir, timeout_min: int | None = None):
    """Several partitions, on SLURM: the queue's waits asked again as the job is submitted (the
    chosen partition's and the runner-up's). Where the runner-up would now end first, say so;
    with launch.replan ``move``, train there instead (its config and predictions, written by
    the plan under .snakemake/tula/partitions/ and results/partitions/). Written to
    ``out_dir``/queue.json. Returns the config, point and predictions to train with, or None
    to keep the plan's."""
    sel = Selection.read(selection)
    block = sel.across_partitions
    if not block or cfg.launch.replan == "off" or not block.runner_up:
        return None
    runner = block.runner_up.point
    other = block.runner_up.partition
    runner_cfg = config_mod.load(partitions.snapshot_path(other))
    time_min = cfg.launch.timeout_min or timeout_min or slurm_queue.DEFAULT_TIME_MIN
    try:
        waits = {
            name: slurm_queue.wait_for(c, p.workers, name, time_min).wait_s
            for name, c, p in (
                (block.chosen, cfg, sel.selected),
                (other, runner_cfg, runner),
            )
        }
    except slurm_queue.QueueUnreadable as err:
        print(f"[launch] the queue's wait could not be asked again: {err}")
        return None
    again = across.after_wait(block, waits)
    move = again["runner_first"] and cfg.launch.replan == "move"
    again.update(moved=move, replan=cfg.launch.replan, caveat=slurm_queue.CAVEAT)
    write_json(Path(out_dir) / "queue.json", again)
    if not again["runner_first"]:
        print(f"[launch] queue asked again: {again['reason']}")
        return None
    print(
        f"[launch] queue asked again: {again['reason']}. "
        + (
            f"launch.replan: move: training on {other} instead"
            if move
            else f"Staying (launch.replan: {cfg.launch.replan}); to move, set launch.replan: move"
        )
    )
    if not move:
        return None
    predictions = Path(selection).parent / "partitions" / other / "predictions.csv"
    return runner_cfg, runner.key, predictions


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
    cfg, point = config_mod.load(cfg_path), selected_point(selection)
    if resolve_executor(cfg, executor_hint) == "slurm":
        moved = queue_again(cfg, selection, out_dir, timeout_min)
        if moved:
            cfg, point, predictions = moved
    final = train(
        cfg,
        point,
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
