"""selection.json as `tula select` writes it, for the tests that start at a choice: every key
the type (:class:`tula.model.selection.Selection`) requires, with the figures a test names."""

from __future__ import annotations

from typing import Any

from tula.model.selection import Point, Selection


def point(workers: int, batch: int, **figures: Any) -> Point:
    """(N, B) chosen, one node, B / N per worker; ``figures`` replace any field."""
    base: dict[str, Any] = dict(
        workers=workers,
        nodes=1,
        global_batch=batch,
        local_batch=batch // workers,
        step_time_s=0.0,
        train_time_s=0.0,
        cost=0.0,
        currency="USD",
        mem_bytes=0.0,
        probed=True,
    )
    return Point(**{**base, **figures})


def selection(
    workers: int, batch: int, *, objective: str = "time", reason: str = "the test's", **figures
) -> Selection:
    """A choice of (N, B) under ``objective``, no runner-up; ``figures``: the point's."""
    return Selection(
        objective=objective,
        candidates=1,
        excluded={},
        selected=point(workers, batch, **figures),
        runner_up=None,
        reason=reason,
        pricing={"model": "worker_hour", "currency": "USD"},
    )


def selection_json(workers: int, batch: int, **kw: Any) -> dict[str, Any]:
    """:func:`selection` as selection.json holds it."""
    return selection(workers, batch, **kw).to_json()
