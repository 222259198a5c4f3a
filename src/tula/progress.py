"""Progress lines a person can follow in a rule's log: counter, rate, ETA."""

from __future__ import annotations

import sys
import time


def fmt_duration(seconds: float) -> str:
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def fmt_span(seconds: float) -> str:
    """A duration as a person reads it: tenths of a second below a minute."""
    return f"{seconds:.1f} s" if seconds < 60 else fmt_duration(seconds)


class Progress:
    """Prints ``[label] what i/n  rate unit/s  ETA ..`` at most every ``every_s`` seconds."""

    def __init__(
        self,
        label: str,
        total: int,
        unit: str = "step",
        every_s: float = 2.0,
        enabled: bool = True,
        start: int = 0,
    ):
        """``start``: units already done before this process (a resumed run); the rate counts only
        new ones."""
        self.label, self.total, self.unit, self.start = label, total, unit, start
        self.every_s, self.enabled = every_s, enabled
        self.t0 = self.last = time.perf_counter()

    def retotal(self, total: int) -> None:
        """The work turned out larger or smaller (a probe timing until its precision)."""
        self.total = total

    def update(self, done: int, what: str = "", extra: str = "", force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and done < self.total and now - self.last < self.every_s:
            return
        self.last = now
        elapsed = now - self.t0
        rate = (done - self.start) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - done) / rate if rate > 0 else float("nan")
        eta_s = fmt_duration(eta) if eta == eta else "?"
        msg = (
            f"[{self.label}] {what}{done}/{self.total} {self.unit}s  {rate:.2f} {self.unit}/s  "
            f"elapsed {fmt_duration(elapsed)}  ETA {eta_s}"
        )
        print(msg + (f"  {extra}" if extra else ""), file=sys.stdout, flush=True)
