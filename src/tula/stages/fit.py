"""The fit stage: the memory model (Eq. 3) and the step-time model (Eq. 2) from a
measurements table (``tula fit`` -> results/model/memory.json, perf.json). No torch."""

from __future__ import annotations

from pathlib import Path

from tula import config as config_mod
from tula.io import write_json
from tula.model import measurements as measurements_mod
from tula.model import memory as memory_mod
from tula.model import perf as perfmodel


def multi_worker_probes(df) -> list[dict]:
    """Every probe of N > 1 workers: where sync was (or was not) measured, and why not."""
    probes = measurements_mod.probes(df)
    return [
        {
            "workers": int(r["workers"]),
            "global_batch": int(r["global_batch"]),
            "status": str(r["status"]),
            "error": r["error"] if isinstance(r.get("error"), str) else None,
        }
        for _, r in probes[probes["workers"] > 1].iterrows()
    ]


def no_sync_measured(multi: list[dict], fallback: bool, source) -> None:
    """No multi-worker probe succeeded: stop with their own errors, or (probe.no_sync_fallback)
    say that only N = 1 will be predicted. Never a silent model without communication."""
    lines = [
        f"  - N={p['workers']} B={p['global_batch']}: {p['status']}: "
        f"{p['error'] or 'no error recorded'}"
        for p in multi
    ] or ["  - none was run"]
    what = (
        f"{source}: no multi-worker probe succeeded, so nothing measured what communication "
        "costs:\n" + "\n".join(lines)
    )
    if not fallback:
        raise ValueError(
            what + f"\nFix these probes (their logs: {Path(source).parent / 'logs' / 'probe'}/), "
            "or set probe.no_sync_fallback: true to predict N = 1 only."
        )
    print(
        f"[fit] WARNING: {what}\n[fit] probe.no_sync_fallback is true: only N = 1 is predicted; "
        "every N > 1 is marked infeasible"
    )


def _say_fits(perf: perfmodel.PerfModel) -> None:
    """The chosen forms and how many probes the fit explains within their own noise."""
    for name, fitted in (("compute", perf.compute), ("step", perf.step)):
        if fitted is not None:
            params = ", ".join(f"{k}={v:.3g}" for k, v in fitted.params().items())
            print(
                f"[fit] {name}: {fitted.form.name}: {fitted.form.text}, {params}"
                f"  ({fitted.extra.get('why')})"
            )
    far = [r for r in perf.residuals if r["within_noise"] is False]
    print(
        f"[fit] probes within their measured precision: {len(perf.residuals) - len(far)} of "
        f"{len(perf.residuals)}"
        + "".join(
            f"; N={r['workers']} B={r['global_batch']}: {r['error_pct']:+.1f} % (measured to "
            f"+-{r['noise_pct']:.1f} %)"
            for r in far
        )
    )


def run(config: str | Path, measurements: str | Path, memory_out: str | Path, perf_out: str | Path):
    """Fit both models on the ok rows of ``measurements``; write them; return (memory, perf)."""
    cfg = config_mod.load(config)
    df = measurements_mod.load(measurements)
    if not (df["status"] == "ok").any():
        raise ValueError(
            f"{measurements}: no probe succeeded (statuses: "
            f"{', '.join(sorted(set(df['status'])))}); nothing to fit. Look at the probe logs "
            f"under {Path(measurements).parent / 'logs' / 'probe'}/."
        )
    multi = multi_worker_probes(df)
    sync_measured = any(p["status"] == "ok" for p in multi)
    if max(cfg.grid.workers) > 1 and not sync_measured:
        no_sync_measured(multi, cfg.probe.no_sync_fallback, measurements)
    mem = memory_mod.fit(df, cfg.hardware.memory_budget_bytes)
    perf = perfmodel.fit(df, cfg.hardware.collective, cfg.cluster.workers_per_node)
    counts = {
        s: int(((df["source"] == s) & (df["status"] == "ok")).sum())
        for s in measurements_mod.SOURCES
    }
    write_json(memory_out, {**mem.to_dict(), "search": cfg.search})
    write_json(
        perf_out,
        {
            **perf.to_dict(),
            "search": cfg.search,
            "rows_fitted": counts,
            "probes_fitted": counts["probe"],
            "sync_measured": sync_measured,
            "multi_worker_probes": multi,
        },
    )
    _say_fits(perf)
    bmax = mem.max_local_batch()
    print(
        f"[fit] memory_bytes = {mem.fit.intercept:.4g} + {mem.fit.slope:.4g} * b; largest feasible "
        f"b: {bmax if bmax is not None else 'unbounded'} -> {memory_out}, {perf_out}"
    )
    return mem, perf
