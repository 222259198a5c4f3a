"""The report's "Nodes and links": where the probes and the production job ran, and what the
links between their workers carried, level by level, as the probes measured it."""

from __future__ import annotations

import html
from collections import Counter

import pandas as pd

LEVELS = (
    ("within a node", lambda m: (m["nodes"] == 1) & (m["workers"] > 1)),
    ("between nodes", lambda m: m["nodes"] > 1),
)


def _hosts(values) -> list[str]:
    return [h for v in values if isinstance(v, str) for h in v.split()]


def _placed(hosts: list[str]) -> str:
    """``tula-n0 (2 workers), tula-n1 (2 workers)``"""
    return ", ".join(f"{h} ({k} worker{'s' if k > 1 else ''})" for h, k in Counter(hosts).items())


def link_line(level: str, rows: pd.DataFrame) -> str:
    """One level's sync as its probes measured it, and the ring bus bandwidth it implies
    (NCCL-tests' busbw: 2(N-1)/N x the gradient bytes / the sync time)."""
    n = rows["workers"].astype(float)
    busbw = rows["grad_bytes_per_step"] * 2 * (n - 1) / n / rows["sync_time_s"]
    return (
        f"<li><b>{level}</b> (N = {', '.join(str(w) for w in sorted(set(rows['workers'])))}, "
        f"{len(rows)} probe(s)): sync median {1e3 * rows['sync_time_s'].median():.1f} ms for "
        f"{rows['grad_bytes_per_step'].median() / 2**20:.2f} MiB of gradients a step: "
        f"{busbw.median() / 1e6:.1f} MB/s ring bus bandwidth{_one_host(level, rows)}</li>"
    )


def _one_host(level: str, rows: pd.DataFrame) -> str:
    """Where the plan's nodes (cluster.workers_per_node) were one machine, as in a local run:
    the links measured are that machine's, not the cluster's."""
    hosts = set(_hosts(rows["hosts"])) if "hosts" in rows.columns else set()
    if level != "between nodes" or len(hosts) != 1:
        return ""
    return (
        f"; the plan's nodes were one machine here ({html.escape(hosts.pop())}), so this is "
        "that machine's rate, not a link's between nodes"
    )


def nodes_section(measurements: pd.DataFrame, final: dict) -> str:
    """Which hosts ran the probes and the production job, and each network level's links."""
    m = measurements
    if "source" in m.columns:
        m = m[m["source"] == "probe"]
    m = m[m["status"] == "ok"]
    out = ["<h2>Nodes and links</h2><ul>"]
    prod = final.get("hostnames") or []
    if prod:
        out.append(
            f"<li>The production job ran its {len(prod)} worker(s) on {len(set(prod))} node(s): "
            f"{html.escape(_placed(prod))}.</li>"
        )
    probed = sorted(set(_hosts(m["hosts"]))) if "hosts" in m.columns else []
    if probed:
        out.append(f"<li>The probes ran on {html.escape(', '.join(probed))}.</li>")
    needed = {"nodes", "sync_time_s", "grad_bytes_per_step"}
    if needed <= set(m.columns):
        timed = m[(m["sync_time_s"] > 0) & (m["grad_bytes_per_step"] > 0)]
        for level, where in LEVELS:
            if where(timed).any():
                out.append(link_line(level, timed[where(timed)]))
    if len(out) == 1:
        return (
            "<h2>Nodes and links</h2><p class=sub>No host or multi-worker probe was recorded: "
            "no link was measured.</p>"
        )
    return "\n".join(out) + (
        "</ul><p class=sub>Bus bandwidth is the rate the links carried a step's all-reduce, "
        "comparable to a link's rated speed (a ring moves 2(N-1)/N of the gradients over "
        "each link).</p>"
    )
