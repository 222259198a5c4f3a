"""``tula queue``: the queue's expected wait in front of each job shape of one partition's
grid, as SLURM estimates it now (:mod:`tula.slurm.queue`), for objective ``time_to_result``.

Writes results/partitions/<name>/queue.json: the partition, each shape's wait and start, the
source, when it was asked, and what the figure is (the scheduler's estimate; backfill can move
it). Under the local executor there is no queue: the file says so and holds no wait. When
SLURM does not answer, the file says why and holds no wait, and the choice is by time alone.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from tula import config as config_mod
from tula.io import write_json
from tula.slurm import queue as slurm_queue


def ask(cfg, partition: str, time_min: int) -> dict[str, Any]:
    """Each grid N's job shape on ``partition``, and its wait: queue.json's body."""
    waits = []
    for n in cfg.grid.workers:
        try:
            waits.append(
                {"workers": n, **slurm_queue.wait_for(cfg, n, partition, time_min).to_dict()}
            )
        except slurm_queue.QueueUnreadable as err:
            return {"waits": [], "error": str(err)}
    return {"waits": waits, "error": None}


def run(
    config,
    out,
    executor: str = "slurm",
    timeout_min: int | None = None,
    partition: str | None = None,
) -> dict:
    """``tula queue``: ask SLURM (under the SLURM executor) how long ``partition``'s job shapes
    (else launch.slurm_partition's) would wait, and write ``out``."""
    cfg = config_mod.load(config)
    partition = partition or cfg.launch.slurm_partition
    time_min = cfg.launch.timeout_min or timeout_min or slurm_queue.DEFAULT_TIME_MIN
    now = time.time()
    body: dict[str, Any] = {
        "partition": partition,
        "time_limit_min": time_min,
        "asked_at": now,
        "asked_at_utc": f"{datetime.fromtimestamp(now, timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
        "source": slurm_queue.SOURCE,
        "caveat": slurm_queue.CAVEAT,
    }
    if executor != "slurm" or not partition:
        why = "the local executor runs every job here" if executor != "slurm" else "no partition"
        body.update(waits=[], error=f"no queue: {why}")
    else:
        body.update(ask(cfg, partition, time_min))
    write_json(out, body)
    said = ", ".join(f"N={w['workers']}: {w['wait_s']:.0f} s" for w in body["waits"])
    print(f"[queue] {partition}: {said or body['error']} -> {out}")
    return body
