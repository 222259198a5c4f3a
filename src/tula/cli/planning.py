"""`tula` subcommands of the planning stages: check, memprobe, probe, aggregate, fit,
predict, select. Each imports its stage's module when it runs."""

from __future__ import annotations

from tula.cli.args import cfg_arg
from tula.config import ConfigError

# Each command imports its stage's module when it runs, so `tula --help` and each stage load
# only what that stage needs (pandas, scipy, matplotlib; torch only in workers).


def cmd_check(a) -> None:
    from tula.stages import check

    check.run(
        a.config,
        a.out,
        config_only=a.config_only,
        profile=a.profile,
        cluster=a.cluster,
        resolved=a.resolved,
    )


def add_check(sub) -> None:
    s = sub.add_parser(
        "check",
        help="validate a config, its dataset and model, and list the points a search would probe",
        description="Validate the config; load workload.dataset (files, folders, your callable, a "
        "first sample) and build workload.model and run it on a batch of real samples. Every "
        "mistake names its config key. Nothing is trained or queued.",
    )
    cfg_arg(s)
    s.add_argument(
        "--config-only", action="store_true", help="only validate the config (no dataset, no model)"
    )
    s.add_argument(
        "--profile",
        metavar="DIR",
        help="also read this Snakemake profile (e.g. slurm): its partitions, "
        "account and the training runtime",
    )
    s.add_argument(
        "--cluster",
        action="store_true",
        help="also check, with sinfo/scontrol, that the partition(s) can "
        "run the memory probe, the probes and training (nodes, CPUs, GPUs per node, time limit)",
    )
    s.add_argument(
        "--out",
        help="write the workload's description (samples, classes, shape, parameters) as JSON",
    )
    s.add_argument(
        "--resolved",
        metavar="PATH",
        help="write the config as the jobs will read it (device, backend, memory budget and "
        "every default decided): the file the workflow writes to .snakemake/tula/config.json",
    )
    s.set_defaults(func=cmd_check)


def cmd_memprobe(a) -> None:
    from tula.stages import memprobe

    memprobe.run(a.config, a.out, workload=a.workload)


def add_memprobe(sub) -> None:
    s = sub.add_parser(
        "memprobe",
        help="measure peak memory at a few local batches on one worker: b_max",
        description="Run one worker at a few local batches (probe.memory_batches), measure each "
        "one's peak memory on real training steps, fit the memory model (Eq. 3) and write b_max, "
        "the largest local batch that fits. Runs before any timing probe: the search set never "
        "includes a point beyond b_max.",
    )
    cfg_arg(s)
    s.add_argument("--out", required=True, help="JSON to write (results/memory_probe.json)")
    s.add_argument(
        "--workload",
        help="tula check's results/workload.json: its estimate of the step's memory rules out the "
        "local batches far beyond the budget (not measured), and is checked against the probe",
    )
    s.set_defaults(func=cmd_memprobe)


def cmd_probe(a) -> None:
    from tula.stages import probe

    if (a.global_batch is None) == (a.job is None):
        raise ConfigError(
            "tula probe: give --global-batch B with --out FILE (one point), or --job FILE "
            "(every batch the search set probes at N, in one job)"
        )
    if a.global_batch is None:
        probe.run_at(a.config, a.workers, a.job, memory_probe=a.memory_probe)
    elif a.out is None:
        raise ConfigError("tula probe --global-batch: --out FILE (the record to write) is missing")
    else:
        probe.run(a.config, a.workers, a.global_batch, a.out, memory_probe=a.memory_probe)


def add_probe(sub) -> None:
    s = sub.add_parser(
        "probe",
        help="run the short DDP probes at N (every batch of the search set, or one B) in one "
        "job and record step time and memory",
        description="Launch N workers (torchrun locally, srun in a SLURM job) that probe each "
        "batch in turn in one process: time synced and no-sync steps at local batch B/N, count "
        "memory (Eq. 3), and write each probe record. A failed probe (oom/error/timeout) is "
        "recorded with its status and exits 0.",
    )
    cfg_arg(s)
    s.add_argument("--workers", type=int, required=True, help="N: number of data-parallel workers")
    s.add_argument("--global-batch", type=int, help="B: one global batch to probe (divisible by N)")
    s.add_argument("--out", help="with --global-batch: the probe record to write")
    s.add_argument(
        "--job",
        help="every batch the search set probes at N: the job's list to write "
        "(results/partitions/<name>/probes/N{n}/job.json), each record beside it (B{b}.json); "
        "a record there already, ok and measured with the same settings, is kept",
    )
    s.add_argument(
        "--memory-probe",
        help="results/memory_probe.json: b_max (which batches are probed, and the compute "
        "sweep's bound), and which smaller batches a partial search falls back to after an OOM",
    )
    s.set_defaults(func=cmd_probe)


def cmd_aggregate(a) -> None:
    from tula.stages import aggregate

    aggregate.run(a.probes, a.out, memory_probe=a.memory_probe)


def add_aggregate(sub) -> None:
    s = sub.add_parser(
        "aggregate",
        help="collect probe records into measurements.csv",
        description="Collect probe JSON records into one CSV, "
        "one row per probe, failed ones included.",
    )
    s.add_argument(
        "probes",
        nargs="+",
        help="probe records, or probe jobs' lists "
        "(results/partitions/<name>/probes/N{n}/job.json: its records)",
    )
    s.add_argument(
        "--memory-probe", help="results/memory_probe.json: its points become `source = memory` rows"
    )
    s.add_argument("--out", required=True, help="CSV to write (results/measurements.csv)")
    s.set_defaults(func=cmd_aggregate)


def cmd_fit(a) -> None:
    from tula.stages import fit

    fit.run(a.config, a.measurements, a.memory_out, a.perf_out)


def add_fit(sub) -> None:
    s = sub.add_parser(
        "fit",
        help="fit the memory (Eq. 3) and step-time (Eq. 2) models",
        description="Fit peak memory linear in local batch "
        "(statsmodels WLS), and choose and fit the compute and step forms (scipy, bounded, chosen "
        "by held-out error) on the ok rows of a measurements CSV.",
    )
    cfg_arg(s)
    s.add_argument(
        "--measurements",
        required=True,
        help="measurements CSV (see docs/results.md for its columns)",
    )
    s.add_argument(
        "--memory-out", required=True, help="memory model JSON to write (results/model/memory.json)"
    )
    s.add_argument(
        "--perf-out", required=True, help="step-time model JSON to write (results/model/perf.json)"
    )
    s.set_defaults(func=cmd_fit)


def cmd_predict(a) -> None:
    from tula.stages import predict

    predict.run(a.config, a.measurements, a.memory, a.perf, a.out, a.train_samples, a.workload)


def add_predict(sub) -> None:
    s = sub.add_parser(
        "predict",
        help="predict step time, T, C and memory at every grid point",
        description="Predict every (N, B) of the config's grid, probed or not: step time, training "
        "time T (Eq. 4a), cost C (Eq. 4b), memory and feasibility.",
    )
    cfg_arg(s)
    s.add_argument(
        "--measurements", required=True, help="measurements CSV (to mark probed points and OOMs)"
    )
    s.add_argument("--memory", required=True, help="memory model JSON (results/model/memory.json)")
    s.add_argument("--perf", required=True, help="step-time model JSON (results/model/perf.json)")
    s.add_argument(
        "--train-samples",
        type=int,
        default=None,
        help="D, training samples per epoch (default: from the probes, else from --workload)",
    )
    s.add_argument(
        "--workload",
        default=None,
        help="results/workload.json (tula check's), for D when no probe recorded it",
    )
    s.add_argument("--out", required=True, help="CSV to write (results/predictions.csv)")
    s.set_defaults(func=cmd_predict)


def cmd_select(a) -> None:
    from tula.stages import select

    select.run(a.config, a.predictions, a.out, a.measurements, a.perf, a.memory, a.queue)


def add_select(sub) -> None:
    s = sub.add_parser(
        "select",
        help="choose (N, B) for the objective: time, cost, knee, time or cost to accuracy",
        description="Pick the configuration for config key "
        "`objective` among feasible points inside `constraints`; write the choice, the runner-up "
        "and why.",
    )
    cfg_arg(s)
    s.add_argument("--predictions", required=True, help="predictions CSV from `tula predict`")
    s.add_argument(
        "--measurements",
        default=None,
        help="measurements CSV: with --perf and --memory, the choice is also made on resamples "
        "of the probes' timings (selection.json's robustness)",
    )
    s.add_argument("--perf", default=None, help="step-time model JSON (results/model/perf.json)")
    s.add_argument("--memory", default=None, help="memory model JSON (results/model/memory.json)")
    s.add_argument(
        "--queue",
        default=None,
        help="queue.json of `tula queue`: each point's expected wait (objective time_to_result)",
    )
    s.add_argument("--out", required=True, help="JSON to write (results/selection.json)")
    s.set_defaults(func=cmd_select)


def cmd_plan(a) -> None:
    from tula.stages import plan

    plan.run(
        a.config,
        a.selection,
        a.predictions,
        a.workload,
        a.out_dir,
        a.timeout_min,
        a.slurm_partition,
        a.slurm_account,
        a.mem_mb,
    )


def add_plan(sub) -> None:
    s = sub.add_parser(
        "plan",
        help="the answer to take away: results/plan/{plan.json,train.sbatch}, no training",
        description="Write the chosen point, its LR and schedule and its predictions "
        "(plan.json), and a SLURM batch script that runs your own training script there with "
        "srun and torchrun (train.sbatch). Trains nothing.",
    )
    cfg_arg(s)
    s.add_argument("--selection", required=True, help="selection JSON from `tula select`")
    s.add_argument("--predictions", required=True, help="predictions CSV from `tula predict`")
    s.add_argument("--workload", required=True, help="results/workload.json (tula check)")
    s.add_argument("--out-dir", required=True, help="folder to write (results/plan)")
    s.add_argument("--timeout-min", type=int, help="the job's time limit (the profile's runtime)")
    s.add_argument("--slurm-partition", help="partition (launch.slurm_partition wins)")
    s.add_argument("--slurm-account", help="account (launch.slurm_account wins)")
    s.add_argument("--mem-mb", type=int, help="memory per node (the profile's mem_mb)")
    s.set_defaults(func=cmd_plan)
