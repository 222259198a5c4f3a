"""``tula select``: read the config and predictions.csv, write selection.json. The choice
itself (objectives, constraints, the knee, the re-plan on drift) is :mod:`tula.model.choice`."""

from __future__ import annotations

from typing import Any

import pandas as pd

from tula import config as config_mod
from tula.io import write_json
from tula.model.choice import select


def run(config, predictions, out) -> dict[str, Any]:
    """``tula select``: read the config and predictions.csv, write selection.json."""
    cfg = config_mod.load(config)
    sel = select(pd.read_csv(predictions), cfg)
    write_json(out, sel)
    s = sel["selected"]
    print(
        f"[select] objective {sel['objective']}: N={s['workers']} B={s['global_batch']} — "
        f"{sel['reason']} -> {out}"
    )
    return sel
