"""The report's "Partitions" card (``cluster.partitions``): each partition's own choice and
its value in the objective's measure, the ratio to the chosen one, the queue's wait with its
source and age, and what the probes say of each partition's compute against the first's."""

from __future__ import annotations

import html
import time

from tula.model.selection import Selection
from tula.progress import fmt_span


def _wait_line(name: str, q: dict, now: float) -> str:
    if not q.get("waits"):
        return f"<li>{html.escape(name)}: no wait known ({html.escape(q.get('error') or '')})</li>"
    waits = ", ".join(f"N={w['workers']}: {fmt_span(w['wait_s'])}" for w in q["waits"])
    return (
        f"<li>{html.escape(name)}: {waits} (asked {fmt_span(now - q['asked_at'])} ago, "
        f"{html.escape(q['source'])}, for a {q['time_limit_min']}-min job: "
        f"{html.escape(q['caveat'])})</li>"
    )


def partitions_section(selection: Selection, now: float | None = None) -> str:
    """The card; empty for a one-partition run."""
    block = selection.across_partitions
    if not block:
        return ""
    now = time.time() if now is None else now
    unit, best = block.unit, block.partitions[0].value
    rows = []
    for st in block.partitions:
        p, wait = st.point, st.point.queue_wait_s
        rows.append(
            f"<tr{' class=sel' if st.partition == block.chosen else ''}>"
            f"<td>{html.escape(st.partition)}</td>"
            f"<td>{p.workers}</td><td>{p.global_batch}</td>"
            f"<td>{fmt_span(p.train_time_s)}</td><td>{p.cost:.4g}</td>"
            f"<td>{'' if wait is None else fmt_span(wait)}</td>"
            f"<td>{st.value:.4g} {html.escape(unit)}</td>"
            f"<td>{st.value / best:.2f}x</td></tr>"
        )
    notes = []
    for r in block.compute_ratios or ():
        if r["compute_ratio"] is not None:
            notes.append(
                f"<li>{html.escape(r['partition'])}'s probes: compute step "
                f"{r['compute_ratio']:.2f}x {html.escape(r['versus'])}'s (median over "
                f"{r['points']} (N, B) probed on both)</li>"
            )
    for group in block.same_gpu or ():
        notes.append(
            f"<li>{html.escape(', '.join(group))} have the same GPU: their compute fits should "
            "agree, and what differs between them is the network and the nodes</li>"
        )
    waits = "".join(_wait_line(n, q, now) for n, q in (block.queues or {}).items())
    return (
        "<div class=card><b>Partitions</b>: each partition's own choice, compared by "
        f"{html.escape(block.what)}.<table><tr><th>partition</th><th>N</th><th>B</th>"
        "<th>T</th><th>cost</th><th>queue wait</th><th>measure</th><th>vs chosen</th></tr>"
        + "".join(rows)
        + "</table>"
        + (f"<ul>{''.join(notes)}</ul>" if notes else "")
        + (f"<p>The queue's expected wait:</p><ul>{waits}</ul>" if waits else "")
        + "</div>"
    )
