"""``tula combine``: the choice across the partitions (:mod:`tula.partitions`' table).

Reads each partition's own results (results/partitions/<name>/: predictions.csv,
selection.json, measurements.csv, model/, workload.json, memory_probe.json) and writes

- results/partitions/predictions.csv: every partition's predictions, column ``partition``;
- results/selection.json: with several partitions, the chosen partition's selection with
  ``partition`` and the ``across_partitions`` block (:func:`tula.model.across.choose`), each
  partition's probes' compute step against the first's, and which partitions share a GPU;
  with one, that partition's own selection, byte for byte (there is nothing across);
- the chosen partition's files at their places in results/ (predictions.csv,
  measurements.csv, model/, workload.json, memory_probe.json) and its config at
  results/partitions/chosen.json, so that plotting, the report, ``snakemake plan`` and the
  production job read the chosen partition, one partition or many.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd

from tula import config as config_mod
from tula.io import atomic_write, write_json
from tula.model import across
from tula.model import measurements as measurements_mod
from tula.model.selection import Selection

# the files of one partition that the stages after the choice read, copied for the chosen one
CHOSEN_FILES = (
    "predictions.csv",
    "measurements.csv",
    "model/memory.json",
    "model/perf.json",
    "workload.json",
    "memory_probe.json",
)


def parse_parts(specs: list[str]) -> dict[str, Path]:
    """``NAME=DIR`` arguments, in order."""
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--part {spec!r}: expected NAME=DIR")
        out[name] = Path(path)
    return out


def _copy(src: Path, dst: Path) -> None:
    """Copy atomically (the destination never half-written), honouring the umask."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(dst) as fh, open(src) as f:
        shutil.copyfileobj(f, fh)


def _put_chosen(own: Path, snapshot: Path, out: Path) -> None:
    """The chosen partition's files (its folder ``own``) where the stages after the choice
    read them, and its config (``snapshot``) at results/partitions/chosen.json."""
    for name in CHOSEN_FILES:
        _copy(own / name, out / name)
    _copy(snapshot, out / "partitions" / "chosen.json")


def run(config, parts: list[str], snapshots: str, out_dir: str) -> Selection:
    """``tula combine``: see the module's docstring."""
    cfg = config_mod.load(config)
    dirs = parse_parts(parts)
    sels = {n: Selection.read(d / "selection.json") for n, d in dirs.items()}
    out = Path(out_dir)
    # each partition's predictions with the queue's waits its own choice was made with
    frames = {
        n: across.with_waits(pd.read_csv(d / "predictions.csv"), across.waits_by_workers(q))
        if (q := sels[n].queue)
        else pd.read_csv(d / "predictions.csv")
        for n, d in dirs.items()
    }
    with atomic_write(out / "partitions" / "predictions.csv") as fh:
        across.combine(frames).to_csv(fh, index=False)
    if len(dirs) == 1:  # a table of one: its own choice, as its select wrote it
        (chosen,) = dirs
        _put_chosen(dirs[chosen], Path(snapshots) / f"{chosen}.json", out)
        _copy(dirs[chosen] / "selection.json", out / "selection.json")
        s = sels[chosen].selected
        print(f"[combine] one partition, {chosen}: N={s.workers} B={s.global_batch}")
        return sels[chosen]
    sel = across.choose(frames, sels, cfg.objective, cfg.knee_on, cfg.pricing.currency)
    measured = {n: measurements_mod.load(d / "measurements.csv") for n, d in dirs.items()}
    gpus = {e["name"]: e.get("gpu") for e in cfg.cluster.partitions if e["name"] in dirs}
    block = replace(
        sel.across_partitions,
        compute_ratios=tuple(across.compute_ratios(measured)),
        same_gpu=tuple(map(tuple, across.same_gpu(gpus))),
        queues={n: s.queue for n, s in sels.items() if s.queue},
    )
    sel = replace(sel, across_partitions=block)
    chosen = sel.partition
    _put_chosen(dirs[chosen], Path(snapshots) / f"{chosen}.json", out)
    write_json(out / "selection.json", sel.to_json())
    s = sel.selected
    print(
        f"[combine] {len(dirs)} partitions: {chosen} N={s.workers} B={s.global_batch} — "
        f"{sel.reason} -> {out / 'selection.json'}"
    )
    return sel
