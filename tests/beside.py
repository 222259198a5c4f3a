"""`make test`'s two sessions. The tests that time nothing, bound no wall-clock time and share
no run (sharing.light) run in one process at idle CPU priority: a cgroup v1 cpu group with
cpu.idle set, whose processes get a core only where nothing else wants it. Beside them the rest
runs on the xdist workers as before. The light tests so use what the rest leaves idle (the core
an `alone` test does not use, the waits of the SLURM tests) and never slow a timed run: an idle
group's task yields at once to any other.

Where no such group can be made (not root, cgroup v2, a kernel without cpu.idle), the whole
suite runs in the one xdist session, as before.

    python tests/beside.py PYTEST_ARGS...    # what make test runs (its -n, its -m)

The light session's output goes to a log (its last lines printed at the end; all of it, and the
log kept, if it failed); TULA_SUITE_TIME_JSON=PATH gets PATH from the xdist session and PATH.light
from the idle one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CPU = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller
PREFIX = "tula-suite-idle-"  # and the run's pid: each run its own group, removed as it ends
NO_TESTS = 5  # pytest's exit status where nothing was selected


def idle_group(group: Path | None = None) -> Path | None:
    """This run's idle cgroup (``group``, else PREFIX and this pid), made, the groups of runs
    no longer alive removed first; None (and why, on stderr) where none can be."""
    group = group or CPU / f"{PREFIX}{os.getpid()}"
    why = None
    if os.geteuid() != 0:
        why = "not root"
    elif not (group.parent / "cpu.idle").exists():
        why = f"no cgroup v1 cpu controller with cpu.idle at {group.parent}"
    else:
        try:
            for stale in CPU.glob(f"{PREFIX}*"):
                if not _alive(stale.name.removeprefix(PREFIX)):
                    remove(stale)
            group.mkdir(exist_ok=True)
            (group / "cpu.idle").write_text("1")
            return group
        except OSError as exc:
            why = f"{group}: {exc}"
    print(f"[beside] the whole suite in one session ({why})", file=sys.stderr)
    return None


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        pass
    return True


def remove(group: Path) -> None:
    """The group, once its processes have left (one still in it after 2 s: kept)."""
    for _ in range(20):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # EBUSY: a process of this run still exiting
            time.sleep(0.1)


def run(args: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest"]
    group = idle_group()
    if group is None:
        return subprocess.call([*pytest, *args])
    times = os.environ.get("TULA_SUITE_TIME_JSON")
    light_env = dict(os.environ, **({"TULA_SUITE_TIME_JSON": f"{times}.light"} if times else {}))
    # the light tests' own arguments: the caller's less its xdist ones (one process)
    own = [a for i, a in enumerate(args) if a not in ("-n", "--dist") and not _value_of_x(args, i)]
    log = tempfile.NamedTemporaryFile("w+", prefix="tula-light-", suffix=".log", delete=False)

    def into_group() -> None:  # in the child, before it runs pytest
        (group / "cgroup.procs").write_text(str(os.getpid()))

    try:
        light = subprocess.Popen(
            [*pytest, "--part", "light", "-p", "no:xdist", *own],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=light_env,
            preexec_fn=into_group,
        )
        print(f"[beside] the light tests at idle CPU priority beside these, log {log.name}")
        heavy = subprocess.call([*pytest, "--part", "heavy", *args])
        light_rc = light.wait()
    finally:
        remove(group)
    light_rc = 0 if light_rc == NO_TESTS else light_rc  # a -m that selects none of them
    text = Path(log.name).read_text(errors="replace")
    print(f"\n[beside] the light tests, at idle priority (exit {light_rc}):")
    print(text if light_rc else "\n".join(text.splitlines()[-12:]))
    if not light_rc:
        os.unlink(log.name)
    return heavy or light_rc


def _value_of_x(args: list[str], i: int) -> bool:
    """args[i] is the value of -n or --dist."""
    return i > 0 and args[i - 1] in ("-n", "--dist")


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
