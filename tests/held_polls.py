"""`snakemake` as the suite's SLURM runs start it: the same command, the same SLURM executor
plugin and its same `sacct` queries, with one difference, its status checks held at the
profile's interval (`slurm-init-seconds-before-status-checks`: 2 s in the suite's profiles).

snakemake-executor-plugin-slurm adds 10 s to the interval after every check that finds no job
finished, up to 180 s (its docs, "further.md": to spare a busy controller), and has no setting
that turns this off (2.8.0, ``Executor.check_active_jobs``). A user's jobs run for hours, and the
back-off costs them nothing. The suite's jobs run for 10-40 s, and the back-off had each of them
noticed 5-20 s after it ended: 42 s of one 146-s SLURM DAG (tests/test_dag_slurm.py's first
test; sacct's End against the log's "Finished"). The shipped profiles are left as users get
them; bench/ scripts that time a user's run call plain `snakemake`.

    python tests/held_polls.py --profile profiles/test ...   # as `snakemake --profile ...`
"""

import sys

import snakemake_executor_plugin_slurm as slurm
from snakemake.cli import main

_check = slurm.Executor.check_active_jobs


async def _held(self, active_jobs):
    """The plugin's own check, its next interval then put back to the profile's."""
    async for job in _check(self, active_jobs):
        yield job
    self.next_seconds_between_status_checks = (
        self.workflow.executor_settings.init_seconds_before_status_checks
    )


slurm.Executor.check_active_jobs = _held

if __name__ == "__main__":
    sys.exit(main())
