"""`tula` subcommands for the partitions (the profile's, or those of ``cluster.partitions``):
queue, combine. Each imports its stage's module when it runs."""

from __future__ import annotations

from tula.cli.args import cfg_arg

# Each command imports its stage's module when it runs, so `tula --help` loads none of them.


def cmd_queue(a) -> None:
    from tula.stages import queue

    queue.run(
        a.config,
        a.out,
        executor=a.executor_hint,
        timeout_min=a.timeout_min,
        partition=a.partition or None,
    )


def add_queue(sub) -> None:
    s = sub.add_parser(
        "queue",
        help="ask SLURM how long each job shape of a partition would wait (sbatch --test-only)",
        description="For each N of the grid, the job shape's expected start on the partition "
        "(--partition, else launch.slurm_partition), as `sbatch --test-only` estimates it now; "
        "submits nothing. Objective time_to_result adds the wait to T.",
    )
    cfg_arg(s)
    s.add_argument(
        "--partition",
        default=None,
        help="the SLURM partition the probes ran on (empty or unset: launch.slurm_partition)",
    )
    s.add_argument("--out", required=True, help="JSON to write (queue.json)")
    s.add_argument(
        "--executor-hint",
        choices=("slurm", "local"),
        default="slurm",
        help="local: the jobs run here, there is no queue (the file says so)",
    )
    s.add_argument(
        "--timeout-min",
        type=int,
        default=None,
        help="the production job's time limit when launch.timeout_min is unset (default 1440)",
    )
    s.set_defaults(func=cmd_queue)


def cmd_combine(a) -> None:
    from tula.stages import combine

    combine.run(a.config, a.part, a.snapshots, a.out_dir)


def add_combine(sub) -> None:
    s = sub.add_parser(
        "combine",
        help="choose across the partitions from each one's own predictions and choice",
        description="Compare each partition's choice by the objective's measure (T, C, time or "
        "cost to accuracy, queue wait + T); write the choice across partitions (one "
        "partition: its own choice) and put the chosen partition's files where the stages "
        "after select read them.",
    )
    cfg_arg(s)
    s.add_argument(
        "--part",
        action="append",
        required=True,
        metavar="NAME=DIR",
        help="a partition and its results folder (results/partitions/NAME); once per partition",
    )
    s.add_argument(
        "--snapshots",
        required=True,
        help="the folder of the partitions' config snapshots (.snakemake/tula/partitions)",
    )
    s.add_argument("--out-dir", required=True, help="where the choice goes (results)")
    s.set_defaults(func=cmd_combine)
