# The validated config, and the input, parameter and resource functions the rules use.
# Nothing here acts while Snakemake parses: the device is decided when the first job asks
# for it, and the config snapshot the jobs read is written by `onstart` (rules/hooks.smk),
# so `snakemake -n` and `--lint` write nothing and ask the cluster nothing. (A dry run runs
# Snakemake's own dry-run executor in place of the SLURM one, so it decides the device as for
# this machine, and says so; the SLURM executor plugin itself asks `scontrol show config`.)
import functools
import os
import re

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

from tula import config as tula_config
from tula import dataset_paths as tula_dataset_paths
from tula import devices as tula_devices
from tula import preflight as tula_preflight
from tula.slurm import plugin_patch as tula_plugin_patch
from tula.slurm import shapes as tula_shapes
from tula import pipeline as tula_pipeline
from tula import partitions as tula_partitions
from tula.stages import check as tula_check
from tula.stages import combine as tula_combine
from tula.stages.compare import runs as tula_compare_runs
from tula.stages import summary as tula_summary
from tula import model_inputs as tula_model_inputs
from tula.model.grid import batches_at, search_set
from tula.model.memory import max_local_batch

try:
    # Tula's loader validates before Snakemake's validate (Snakefile), so every wrong key is
    # named in words; `config` takes the validated dict (defaults filled, an unquoted
    # `replan: off` read as "off", not YAML's false), which Snakemake's validate then passes.
    config.update(
        tula_config.validate(
            config, source="workflow/config.yaml (+ --config overrides)"
        )
    )
    TULA = tula_config.from_dict(config)
    # a dataset path that does not exist stops here, before any job is queued
    tula_dataset_paths.check_dataset_paths(TULA)
except tula_config.ConfigError as err:
    raise WorkflowError(str(err))


# --software-deployment-method conda: envs/tula.yaml with its `-e ..` made absolute, since
# Snakemake creates environments from a copy under .snakemake/conda/. Written only when
# Snakemake deploys with conda (it reads the file before any hook runs); never otherwise.
CONDA_ENV = os.path.join(workflow.basedir, "envs", "tula.yaml")
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    CONDA_ENV = str(
        tula_pipeline.conda_env(CONDA_ENV, ".snakemake/tula/conda-env.yaml")
    )


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


def profile_settings():
    """The probes' and the training job's partition, account and runtime, as Snakemake gives
    them (profile and command line; tula.preflight.cluster_settings, as `tula check --profile`).
    """
    return tula_preflight.cluster_settings(profile_resource)


# The partitions planned, a table (tula.partitions): each entry of cluster.partitions, or one,
# the profile's (named after its slurm_partition, else "default"). Every stage up to the choice
# runs once per partition, the {partition} wildcard, under results/partitions/{partition}/ and
# on that partition's config snapshot; `tula combine` (rules/combine.smk) chooses across them
# and puts the chosen one's files in results/.
PROFILE = profile_settings()
TABLE = tula_partitions.table(config, PROFILE)


wildcard_constraints:
    n=r"\d+",
    b=r"\d+",
    partition="|".join(map(re.escape, TABLE)),


@functools.cache
def own(name):
    """Partition ``name``'s config (its entry laid over the user's), the device undecided."""
    return tula_config.from_dict(TABLE[name].config)


def part_config(wildcards):
    """Param function: the config snapshot a partition's jobs read (written by onstart)."""
    return tula_partitions.snapshot_path(wildcards.partition)


def probe_files(wildcards):
    """The probe jobs' folders of the search set (full grid or its corners), one per worker
    count, decided once the memory probe (a checkpoint) has given b_max: no point beyond it
    is probed."""
    name = wildcards.partition
    bmax = max_local_batch(checkpoints.memprobe.get(partition=name).output[0])
    grid = tula_model_inputs.grid_spec(own(name))
    return expand(
        rules.probe.output[0],
        partition=name,
        n=sorted({p.workers for p in search_set(grid, bmax)}),
    )


def probe_job_batches(wildcards):
    """Param function: the batches probe job N{n} measures (its rerun trigger: a grid change
    that changes them runs the job again)."""
    memory = f"{tula_partitions.results_dir(wildcards.partition)}/memory_probe.json"
    bmax = max_local_batch(memory) if os.path.exists(memory) else None
    grid = tula_model_inputs.grid_spec(own(wildcards.partition))
    return ",".join(map(str, batches_at(grid, int(wildcards.n), bmax)))


def parent_dir(name):
    """Param function: the directory of output ``name`` (for stages that write a folder)."""

    def _dir(wildcards, output):
        return os.path.dirname(output[name])

    return _dir


def settings(stage):
    """Param function: the config values a stage depends on (its rerun trigger): its
    partition's, for a stage that runs per partition."""

    def _settings(wildcards):
        name = getattr(wildcards, "partition", None)
        return tula_pipeline.stage_settings(
            decided_in(name) if name else decided(), stage
        )

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
COMPARE_RUNS = tula_compare_runs.run_ids(TULA)


def probe_resource(name):
    """Resource function: what the SLURM job of partition {partition}'s probe N{n} asks for
    (tula.slurm.shapes.job_resources), on its decided device: probe.timeout_s for each of its
    batches, and five minutes."""

    def _resource(wildcards):
        points = len(probe_job_batches(wildcards).split(","))
        cfg = own(wildcards.partition)
        res = tula_shapes.job_resources(
            decided_in(wildcards.partition),
            int(wildcards.n),
            tula_preflight.probe_runtime_min(cfg, points),
            exclusive=cfg.probe.exclusive,
        )
        return res[name]

    return _resource


def memprobe_resource(name):
    """Resource function: the memory probe's job (one worker: its GPU, its threads, and
    probe.timeout_s with five minutes for start-up), on its partition's decided device.
    """

    def _resource(wildcards):
        cfg = decided_in(wildcards.partition)
        return {
            "gres": tula_shapes.job_resources(cfg, 1)["gres"],
            "cpus_per_task": cfg.hardware.threads_per_worker,
            "runtime": tula_preflight.probe_runtime_min(cfg),
        }[name]

    return _resource


def site_resource(name, rule):
    """Resource function: the SLURM partition (``slurm_partition``) or account
    (``slurm_account``) of a partition's `rule` jobs: a listed partition's own name and
    account; the profile's partition whatever the profile gives (empty: the cluster's
    default)."""

    def _resource(wildcards):
        part = TABLE[wildcards.partition]
        if part.listed:
            own_value = (
                part.name
                if name == "slurm_partition"
                else part.config["launch"]["slurm_account"]
            )
            if own_value:
                return own_value
        return profile_resource(name, rule) or ""

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


def plan_args(wildcards):
    """`tula plan` options: what the profile gives the production job (the launch rule's
    runtime, partition, account and memory), for train.sbatch's #SBATCH lines."""
    args = []
    for flag, name in (
        ("--timeout-min", "runtime"),
        ("--slurm-partition", "slurm_partition"),
        ("--slurm-account", "slurm_account"),
        ("--mem-mb", "mem_mb"),
    ):
        value = profile_resource(name, "launch")
        if value not in (None, ""):
            args += [flag, str(value)]
    return " ".join(args)


@functools.cache
def decided():
    """TULA with hardware.device and hardware.backend decided (tula.devices), once, when the
    first job asks: under the SLURM executor from the probe partition's GRES, here from this
    machine's GPUs (CUDA only where every grid point has a GPU per worker, else CPU and gloo).
    Said here (the log), by `tula check` and in the report; the jobs read it from the
    snapshot onstart writes. A job's own Snakemake (remote execution) decides nothing: its
    job reads the snapshot."""
    return decide(TULA, PROFILE["probe_partition"], "")


@functools.cache
def decided_in(name):
    """Partition ``name``'s config with the device decided on its own partition's GPUs (the
    profile's partition: :func:`decided`)."""
    part = TABLE[name]
    if not part.listed:
        return decided()
    return decide(own(name), part.probe_partition(PROFILE), f"{name}: ")


def decide(cfg, partition, named):
    """``cfg`` with the device decided (:func:`decided`) on ``partition``'s GPUs under the
    SLURM executor, this machine's here; said with ``named`` before it."""
    if workflow.remote_exec:
        return cfg
    executor = "slurm" if workflow.non_local_exec else "local"
    try:
        decision = tula_devices.for_config(
            cfg, executor, partition if executor == "slurm" else None
        )
    except tula_devices.DeviceError as err:
        raise WorkflowError(f"{err}\n(see workflow/config.yaml)")
    said = f"tula: {named}{decision.why}"
    if workflow.output_settings.dryrun:
        said += (
            " (a dry run: Snakemake runs no executor, so this is this machine's answer;"
            " a run under the SLURM executor decides from the probe partition's GPUs)"
        )
    print(said, flush=True)
    return tula_devices.apply(cfg, decision)


# The stages after the choice (plot, report, plan, launch) read the chosen partition's files
# where `tula combine` puts them, and the production job and the plan its config; the
# generalization suite reads the user's config, the device decided (written by onstart).
CONFIG = ".snakemake/tula/config.json"
RESULT = {
    "workload": "results/workload.json",
    "memory_probe": "results/memory_probe.json",
    "measurements": "results/measurements.csv",
    "memory": "results/model/memory.json",
    "perf": "results/model/perf.json",
    "predictions": "results/predictions.csv",
    "selection": "results/selection.json",
}
TRAIN_CONFIG = "results/partitions/chosen.json"
# the report's figure of every partition's Pareto front (rules/combine.smk), when there are two
PARTITION_PLOTS = ["results/plots/partitions.png"] if len(TABLE) > 1 else []


def campaign_lines():
    """What the probe campaign buys on each partition (a listed one named)."""
    return [
        f"tula: {f'{name}: ' if part.listed else ''}"
        f"{tula_check.describe_campaign(tula_check.campaign(own(name)))}"
        for name, part in TABLE.items()
    ]


def stale_lines():
    """What under results/ this run will not read (another table's partitions, the layout
    before results/partitions/), said so that nothing is silently mixed."""
    return [f"tula: {line}" for line in tula_partitions.stale("results", list(TABLE))]


# What the probe campaign buys, said before it runs, and what in results/ is stale: a dry run
# (which has no onstart) says it here; a run says it in onstart (rules/hooks.smk).
if workflow.output_settings.dryrun and not workflow.remote_exec:
    for line in campaign_lines() + stale_lines():
        print(line, flush=True)
