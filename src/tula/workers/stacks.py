"""A worker prints its threads' Python stacks a little before the launcher's deadline, so the
log of a worker that hangs shows the line it hangs on."""

from __future__ import annotations

import faulthandler
import os
import time

from tula.workers.processes import DEADLINE_ENV


def dump_stacks_before_deadline(margin_s: float = 5.0, left_s: float | None = None) -> None:
    """In a worker: print every thread's Python stack to stderr (the rule's log) ``margin_s``
    before the launcher's deadline (at most a fifth of the time left), so a worker that hangs
    shows the line it hangs on before it is killed. ``left_s``: the deadline is that far off
    (a probe job's next point, which gets its own); else the launcher's, and nothing where no
    launcher set one."""
    if left_s is None:
        deadline = os.environ.get(DEADLINE_ENV)
        if not deadline:
            return
        left_s = float(deadline) - time.time()
    if left_s > 0:
        faulthandler.dump_traceback_later(left_s - min(margin_s, left_s / 5), exit=False)
