"""The fit stage: the memory model (Eq. 3) and the step-time model (Eq. 2) from a
measurements table (``tula fit`` -> results/model/memory.json, perf.json). No torch."""

from __future__ import annotations

from pathlib import Path

from tula import config as config_mod
from tula.io import write_json
from tula.model import measurements as measurements_mod
from tula.model import memory as memory_mod
from tula.model import perf as perfmodel


def run(config: str | Path, measurements: str | Path, memory_out: str | Path, perf_out: str | Path):
    """Fit both models on the ok rows of ``measurements``; write them; return (memory, perf)."""
    cfg = config_mod.load(config)
    df = measurements_mod.load(measurements)
    if not (df["status"] == "ok").any():
        raise ValueError(f"{measurements}: no probe succeeded (statuses: {', '.join(sorted(set(df['status'])))}); "
                         "nothing to fit. Look at the probe logs under results/logs/probe/.")  # fmt: skip
    mem = memory_mod.fit(df, cfg.hardware.memory_budget_bytes)
    perf = perfmodel.fit(df, cfg.hardware.collective)
    counts = {s: int(((df["source"] == s) & (df["status"] == "ok")).sum()) for s in measurements_mod.SOURCES}
    write_json(memory_out, {**mem.to_dict(), "search": cfg.search})
    write_json(perf_out, {**perf.to_dict(), "search": cfg.search, "rows_fitted": counts,
                          "probes_fitted": counts["probe"]})  # fmt: skip
    c = perf.compute
    print(f"[fit] compute: {c.form.name}: {c.form.text}, "
          + ", ".join(f"{k}={v:.3g}" for k, v in c.params().items()) + f"  ({c.extra.get('why')})")
    if perf.step is not None:
        s = perf.step
        print(f"[fit] step: {s.form.name}: {s.form.text}, " + ", ".join(f"{k}={v:.3g}" for k, v in s.params().items())
              + f"  ({s.extra.get('why')})")  # fmt: skip
    far = [r for r in perf.residuals if r["within_noise"] is False]
    print(f"[fit] probes within their measured noise: {len(perf.residuals) - len(far)} of {len(perf.residuals)}"
          + "".join(f"; N={r['nodes']} B={r['global_batch']}: {r['error_pct']:+.1f} % (noise {r['noise_pct']:.1f} %)"
                    for r in far))  # fmt: skip
    bmax = mem.max_local_batch()
    print(f"[fit] memory_bytes = {mem.fit.intercept:.4g} + {mem.fit.slope:.4g} * b; largest feasible b: "
          f"{bmax if bmax is not None else 'unbounded'} -> {memory_out}, {perf_out}")  # fmt: skip
    return mem, perf
