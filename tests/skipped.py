"""What this machine could not run, said as the last lines of every run (a pytest plugin,
loaded by conftest.py): how many tests were skipped, for each reason. Without SLURM or root
(a laptop, `make test` without CI=true) the SLURM and lab tests skip; `CI=true make test`
starts a one-node cluster (and the lab, as root) and runs them, where a skip is a failure."""

from collections import Counter

import pytest

_why: Counter = Counter()


def pytest_runtest_logreport(report):
    # a skip is reported at setup (a fixture's pytest.skip) or in the call; under pytest-xdist
    # the controller gets the workers' reports, longrepr as (file, line, "Skipped: reason")
    if report.skipped and isinstance(report.longrepr, tuple):
        _why[report.longrepr[2].removeprefix("Skipped: ")] += 1


# the outermost wrapper: after pytest's own short summary, just above the line of counts
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    yield
    if not _why or hasattr(config, "workerinput"):
        return
    tr = terminalreporter
    tr.write_sep("=", f"{sum(_why.values())} tests skipped on this machine")
    for reason, n in _why.most_common():
        tr.write_line(f"{n:5d}  {reason}")
    tr.write_line(
        "CI=true make test (as root) starts a SLURM cluster and the network lab and runs them all"
    )
