"""The production job confirms the prediction, or says by how much it does not: the
prediction for the point the job trained (predictions.csv's row) put beside what the job
measured (final.json), the step and each part of the wall time."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from tula.io import read_json, write_json
from tula.model.perf import evaluation_time


def prediction_row(
    predictions: str | Path | None, workers: int, batch: int
) -> dict[str, Any] | None:
    """predictions.csv's row at (N, B), or None (no predictions, or the point is not in them)."""
    if not predictions or not Path(predictions).exists():
        return None
    p = pd.read_csv(predictions)
    match = p[(p["workers"] == workers) & (p["global_batch"] == batch)]
    return None if match.empty else match.iloc[0].to_dict()


# (name, final.json's measured key, how the prediction of it is made from predictions.csv's row)
def steps_timed(r: dict[str, Any]) -> float:
    """T less the first step at each shape: those the job times apart (first_steps_time_s),
    so its train_time_s counts every other step."""
    k = r.get("first_steps", 0.0)
    return float(r["train_time_s"]) - (0.0 if pd.isna(k) else float(k)) * float(r["step_time_s"])


WALL_PARTS = (
    ("steps", "train_time_s", steps_timed),
    ("start-up", "startup_time_s", lambda r: r["startup_time_s"]),
    ("first steps", "first_steps_time_s", lambda r: r.get("first_steps_time_s", 0.0)),
    ("evaluation", "eval_time_s", evaluation_time),
    ("checkpoints", "checkpoint_time_s", lambda r: r["checkpoints"] * r["checkpoint_time_s"]),
)


def record_prediction(final_path: Path, predictions: str | Path | None) -> dict[str, Any]:
    """Put the prediction for the point the job trained beside what the job measured, in
    final.json: predicted step time (with its 95 % interval) against the mean training step,
    and the job's wall time part by part (``wall_check``: steps, start-up, evaluation,
    checkpoints, and what neither models, the rest) against what it paid."""
    final = read_json(final_path)
    row = prediction_row(predictions, final["workers"], final["global_batch"])
    if row is None:
        return final
    pred_step, pred_T = float(row["step_time_s"]), float(row["train_time_s"])
    timed = steps_timed(row)
    final.update(
        {
            "predicted_step_time_s": pred_step,
            "predicted_step_time_interval_s": [
                float(row["step_time_lo_s"]),
                float(row["step_time_hi_s"]),
            ],
            "predicted_train_time_s": pred_T,
            "predicted_train_time_interval_s": [
                float(row["train_time_lo_s"]),
                float(row["train_time_hi_s"]),
            ],
            "step_time_ratio": final["mean_step_time_s"] / pred_step if pred_step > 0 else None,
            # None where every step is timed apart (one epoch of one step): nothing to compare
            "train_time_ratio": final["train_time_s"] / timed if timed > 0 else None,
            "prediction_note": "predicted_* come from predictions.csv at the trained (N, B); "
            "train_time_s counts training steps only, less the first at each shape (paid apart "
            "as first_steps_time_s), and train_time_ratio compares it with T less those steps; "
            "wall_check compares each part of the wall time",
        }
    )
    final.update(_wall_check(final, row))
    write_json(final_path, final)
    lo, hi = final["predicted_step_time_interval_s"]
    print(
        f"[launch] prediction check at N={final['workers']} B={final['global_batch']}: step "
        f"predicted {1e3 * pred_step:.2f} ms (95 % interval {1e3 * lo:.2f}-{1e3 * hi:.2f}), "
        f"measured {1e3 * final['mean_step_time_s']:.2f} ms (x{final['step_time_ratio']:.3f})",
        flush=True,
    )
    for part in final.get("wall_check") or []:
        pred = (
            "not predicted"
            if part["predicted_s"] is None
            else f"predicted {part['predicted_s']:.1f} s"
        )
        ratio = "" if part["ratio"] is None else f" (x{part['ratio']:.3f})"
        print(
            f"[launch]   {part['part']:<12} {pred}, paid {part['measured_s']:.1f} s{ratio}",
            flush=True,
        )
    return final


def _wall_check(final: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """Each part of the wall time, predicted (predictions.csv) against paid (final.json)."""
    if final.get("wall_time_s") is None or not math.isfinite(
        float(row.get("wall_time_s", math.nan))
    ):
        return {}

    def part(name: str, predicted: float | None, measured: float) -> dict[str, Any]:
        ratio = measured / predicted if predicted else None
        return {"part": name, "predicted_s": predicted, "measured_s": measured, "ratio": ratio}

    parts = [
        part(name, float(pred(row)), float(final.get(key, 0.0))) for name, key, pred in WALL_PARTS
    ]
    rest = final["wall_time_s"] - sum(p["measured_s"] for p in parts)
    wall = float(row["wall_time_s"])
    parts += [part("rest", None, rest), part("wall time", wall, float(final["wall_time_s"]))]
    return {
        "wall_check": parts,
        "predicted_wall_time_s": wall,
        "predicted_wall_time_interval_s": [
            float(row["wall_time_lo_s"]),
            float(row["wall_time_hi_s"]),
        ],
        "wall_time_ratio": final["wall_time_s"] / wall if wall > 0 else None,
    }
