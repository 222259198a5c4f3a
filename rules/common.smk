# Grid expansion, the config snapshot the jobs read, and input/param functions.
import os

from snakemake.exceptions import WorkflowError

from tula import config as tula_config
from tula import dataset_paths as tula_dataset_paths
from tula import devices as tula_devices
from tula import preflight as tula_preflight
from tula import slurm as tula_slurm
from tula import workflow as tula_workflow
from tula.stages import check as tula_check
from tula.stages import compare as tula_compare
from tula.model.grid import search_set
from tula.model.memory import max_local_batch

try:
    TULA = tula_config.from_dict(
        config, source="workflow/config.yaml (+ --config overrides)"
    )
    # a dataset path that does not exist stops here, before any job is queued
    tula_dataset_paths.check_dataset_paths(TULA)
except tula_config.ConfigError as err:
    raise WorkflowError(str(err))


# --software-deployment-method conda: envs/tula.yaml with its `-e ..` made absolute, since
# Snakemake creates environments from a copy under .snakemake/conda/.
CONDA_ENV = str(
    tula_workflow.conda_env(
        os.path.join(workflow.basedir, "envs", "tula.yaml"),
        ".snakemake/tula/conda-env.yaml",
    )
)


wildcard_constraints:
    n=r"\d+",
    b=r"\d+",


def probe_files(wildcards):
    """The probe records of the search set (full grid or its corners), decided once the
    memory probe (a checkpoint) has given b_max: no point beyond it is probed."""
    bmax = max_local_batch(checkpoints.memprobe.get().output[0])
    return expand(
        rules.probe.output[0],
        zip,
        n=[p.workers for p in search_set(TULA, bmax)],
        b=[p.global_batch for p in search_set(TULA, bmax)],
    )


def parent_dir(name):
    """Param function: the directory of output ``name`` (for stages that write a folder)."""

    def _dir(wildcards, output):
        return os.path.dirname(output[name])

    return _dir


def settings(stage):
    """Param function: the config values a stage depends on (its rerun trigger)."""

    def _settings(wildcards):
        return tula_workflow.stage_settings(TULA, stage)

    return _settings


def whole_machine(wildcards):
    """Locally, a probe or training run takes every core: timings must not share the CPU.
    On a cluster each job gets its own CPUs (cpus_per_task per worker task)."""
    if workflow.non_local_exec:
        return TULA.hardware.threads_per_worker
    try:
        return workflow.cores
    except WorkflowError:  # no --cores: `snakemake --report`, `--lint`; nothing runs
        return 1


def compare_threads(wildcards):
    """Locally a run of the suite takes its workers' cores (runs share the machine); on a
    cluster the job gets its own and the watcher here needs one."""
    if workflow.non_local_exec:
        return 1
    return TULA.compare.workers * TULA.hardware.threads_per_worker


# The generalization suite's runs: one compare_run job each (rules/compare.smk).
COMPARE_RUNS = tula_compare.run_ids(TULA)


# A probe job may run for probe.timeout_s; give SLURM five minutes more for start-up.
PROBE_RUNTIME_MIN = tula_preflight.probe_runtime_min(TULA)


def probe_resource(name):
    """Resource function: what the SLURM job of probe N{n}_B{b} asks for (tula.slurm.job_resources)."""

    def _resource(wildcards):
        res = tula_slurm.job_resources(
            TULA, int(wildcards.n), PROBE_RUNTIME_MIN, exclusive=TULA.probe.exclusive
        )
        return res[name]

    return _resource


def launch_args(wildcards, resources):
    """`tula launch` options from Snakemake: its executor (launch.executor: auto follows it)
    and the profile's runtime, partition and account for the launch rule."""
    args = ["--executor-hint", "slurm" if workflow.non_local_exec else "local"]
    for flag, name in (
        ("--timeout-min", "runtime"),
        ("--slurm-partition", "slurm_partition"),
        ("--slurm-account", "slurm_account"),
    ):
        value = getattr(resources, name, None)
        if value not in (None, ""):
            args += [flag, str(value)]
    return " ".join(args)


def profile_resource(name, rule):
    """A resource as the profile (or the command line) gives it to `rule`'s jobs:
    set-resources for the rule, else default-resources; None when unset or unreadable.
    """
    rs = workflow.resource_settings
    for source in (rs.overwrite_resources.get(rule) or {}, rs.default_resources or {}):
        res = source.get(name) if hasattr(source, "get") else None
        if res is None:
            continue
        try:
            value = res.evaluate(
                {}, input=[], attempt=1, threads=1, rulename=rule, async_run=None
            ).value
        except Exception:  # an expression that needs the job itself
            return None
        return value if value not in ("", "None") else None
    return None


# Where the jobs run (hardware.device, hardware.backend), decided once for every job by
# tula.devices: under the SLURM executor from the partition's GRES, here from this machine's
# GPUs (CUDA only where every grid point has a GPU per worker, else CPU and gloo). Said here
# (the log), by `tula check` and in the report; the jobs read it from the snapshot below.
if not workflow.remote_exec:
    try:
        _decision = tula_devices.for_config(
            TULA,
            "slurm" if workflow.non_local_exec else "local",
            (
                profile_resource("slurm_partition", "probe")
                if workflow.non_local_exec
                else None
            ),
        )
    except tula_devices.DeviceError as err:
        raise WorkflowError(f"{err}\n(see workflow/config.yaml)")
    print(f"tula: {_decision.why}", flush=True)
    config.setdefault("hardware", {}).update(
        device=_decision.device, backend=_decision.backend, device_why=_decision.why
    )
    TULA = tula_config.from_dict(config, source="workflow/config.yaml")

# What the probe campaign buys, said before it runs (a dry run, or under the SLURM executor).
if (
    workflow.output_settings.dryrun or workflow.non_local_exec
) and not workflow.remote_exec:
    print(
        f"tula: {tula_check.describe_campaign(tula_check.campaign(TULA))}", flush=True
    )

# Jobs read this merged, validated copy of the config (also on SLURM nodes). A job's own
# Snakemake (remote execution) reads the copy the workflow wrote; it does not write it.
CONFIG = ".snakemake/tula/config.json"
if not workflow.remote_exec:
    tula_workflow.snapshot(config, CONFIG)


onstart:
    # Under the SLURM executor, before anything is submitted: can the partitions run the
    # memory probe, the probes and training? (tula.slurm; `tula check --cluster` alike)
    if workflow.non_local_exec:
        try:
            report = tula_preflight.preflight(
                TULA,
                probe_partition=profile_resource("slurm_partition", "probe"),
                train_partition=TULA.launch.slurm_partition
                or profile_resource("slurm_partition", "launch"),
                train_runtime_min=TULA.launch.timeout_min
                or profile_resource("runtime", "launch"),
            )
            print(f"tula preflight: {tula_preflight.describe(report)}", flush=True)
        except tula_preflight.ClusterUnreadable as err:
            print(f"tula preflight skipped: {err}", flush=True)
        except tula_preflight.PreflightError as err:
            raise WorkflowError(
                f"{err}\n(see workflow/config.yaml and the profile)"
            )
