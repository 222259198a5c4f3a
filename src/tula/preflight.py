"""The preflight: can the SLURM partitions run the jobs this grid needs?

Before anything is queued, ``tula check --cluster`` and the workflow (Snakemake's
``onstart``, under the SLURM executor) read the partition with ``scontrol show partition``
and ``sinfo`` (nodes, CPUs and GPUs per node, the time limit;
:func:`tula.slurm.partition_info.read_partition`)
and compare them with what the memory probe, the probe jobs and the training job will ask
for. A grid that cannot run is refused with one error that lists every problem and the
config keys that fix it, instead of probe jobs that pend forever (``PartitionNodeLimit``) or
an sbatch refusal after the probes. What a job asks for comes from
:func:`tula.slurm.shapes.job_shape`, the function that builds its request, so the check and the
submission cannot disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from tula.config import Config, from_dict
from tula.partitions import Planned
from tula.slurm.controller import ClusterUnreadable
from tula.slurm.partition_info import Partition, PreflightError, read_partition
from tula.slurm.shapes import job_shape

__all__ = [
    "ClusterUnreadable",
    "PreflightError",
    "preflight",
    "describe",
    "read_profile",
    "cluster_settings",
    "job_needs",
    "problems",
]


@dataclass(frozen=True)
class JobNeed:
    """What one job of the workflow asks SLURM for."""

    what: str
    nodes: int
    tasks_per_node: int
    cpus_per_node: int
    gpus_per_node: int
    runtime_min: int | None  # None: not known before the job is submitted
    mem_mb: int | None = None  # sbatch --mem, per node; None: the cluster's default
    mem_key: str = ""  # where mem_mb is set (a profile key or a config key)


def probe_runtime_min(cfg: Config, points: int = 1) -> int:
    """Minutes a (memory) probe job asks for: probe.timeout_s for each of its ``points`` (a
    probe job measures every batch of its N) and five minutes for start-up."""
    return int(points * cfg.probe.timeout_s // 60) + 5


def job_needs(
    cfg: Config,
    train_runtime_min: int | None,
    train_nodes: int | None = None,
    profile_mem_mb: dict[str, int | None] | None = None,
    probe_points: int = 1,
) -> list[JobNeed]:
    """The largest job of each kind the workflow can submit: the memory probe (one worker),
    the probe at the largest grid N (every N is probed in a full search, the corners in a
    partial one, so the largest always is) and training at that N (or at ``train_nodes``:
    `tula launch` knows the N it trains at). Every shape is :func:`job_shape`'s.
    ``profile_mem_mb``: the ``mem_mb`` the profile gives the ``memprobe`` and ``probe`` rules
    (:func:`cluster_settings`); training asks for ``launch.mem_gb``. ``probe_points``: the
    batches the probe job at the largest N measures (:func:`tula.model.grid.batches_at`), each
    with ``probe.timeout_s`` of its own."""
    n = max(cfg.grid.workers)
    tn = train_nodes or n
    mem = profile_mem_mb or {}

    def need(what: str, workers: int, runtime: int | None, mem_mb, mem_key: str) -> JobNeed:
        shape = job_shape(cfg, workers)
        return JobNeed(
            what,
            shape.nodes,
            shape.tasks_per_node,
            shape.tasks_per_node * shape.cpus_per_task,
            shape.gpus_per_node,
            runtime,
            int(mem_mb) if mem_mb else None,
            mem_key,
        )

    def profile_key(rule: str) -> str:
        return f"mem_mb in the profile (default-resources, or set-resources.{rule})"

    train_mb = cfg.launch.mem_gb * 1024 if cfg.launch.mem_gb else None  # submitit: --mem=<n>GB
    return [
        need(
            "the memory probe (1 worker)",
            1,
            probe_runtime_min(cfg),
            mem.get("memprobe"),
            profile_key("memprobe"),
        ),
        need(
            f"the probe at N={n}",
            n,
            probe_runtime_min(cfg, probe_points),
            mem.get("probe"),
            profile_key("probe"),
        ),
        need(f"training at N={tn}", tn, train_runtime_min, train_mb, "launch.mem_gb in the config"),
    ]


def problems(cfg: Config, part: Partition, need: JobNeed, node_states: bool = True) -> list[str]:
    """Why ``part`` cannot run ``need`` (empty: it can), naming the config keys to change.
    With ``node_states``, nodes that cannot start a job now (down, drained, ...) do not count."""
    out: list[str] = []
    wpn, threads = cfg.cluster.workers_per_node, cfg.hardware.threads_per_worker
    big = zip(part.node_cpus, part.node_gpus)
    fit = [i for i, (c, g) in enumerate(big) if c >= need.cpus_per_node and g >= need.gpus_per_node]
    limit = min(part.total_nodes, part.max_nodes or part.total_nodes)
    if need.nodes > limit:
        out.append(
            f"{need.what} needs {need.nodes} node(s) ({need.tasks_per_node} worker(s) per node; "
            f"cluster.workers_per_node={wpn}), but partition '{part.name}' has {part.total_nodes} "
            "node(s)"
            + (f" and allows {part.max_nodes} per job" if part.max_nodes else "")
            + ": lower the largest grid.workers, raise "
            "cluster.workers_per_node if the nodes have the GPUs and CPUs, or use a larger "
            "partition"
        )
    elif len(fit) < need.nodes:
        if need.gpus_per_node and max(part.node_gpus, default=0) < need.gpus_per_node:
            out.append(
                f"{need.what} puts {need.tasks_per_node} worker(s) on a node and needs "
                f"{need.gpus_per_node} GPU(s) per node (cluster.workers_per_node={wpn}, "
                f"hardware.device=cuda), but the nodes of partition '{part.name}' have at most "
                f"{max(part.node_gpus, default=0)}: set cluster.workers_per_node to the GPUs per "
                "node"
            )
        if max(part.node_cpus, default=0) < need.cpus_per_node:
            out.append(
                f"{need.what} needs {need.cpus_per_node} CPUs per node ({need.tasks_per_node} "
                f"worker(s) x hardware.threads_per_worker={threads}), but the nodes of partition "
                f"'{part.name}' have at most {max(part.node_cpus, default=0)}: lower "
                "hardware.threads_per_worker or cluster.workers_per_node"
            )
        if not out:
            out.append(
                f"{need.what} needs {need.nodes} node(s) with {need.cpus_per_node} CPUs and "
                f"{need.gpus_per_node} GPU(s) each, but only {len(fit)} node(s) of partition "
                f"'{part.name}' have that: lower the largest grid.workers or "
                "cluster.workers_per_node"
            )
    if not out and node_states:
        out += _nodes_down(part, need, fit)
    out += _memory(part, need)
    if (
        need.runtime_min is not None
        and part.max_time_min is not None
        and need.runtime_min > part.max_time_min
    ):
        keys = (
            "probe.timeout_s (a probe job asks for it for each of its batches + 5 min)"
            if "probe" in need.what
            else "launch.timeout_min, or the launch rule's runtime in the profile (set-resources)"
        )
        out.append(
            f"{need.what} asks for {need.runtime_min} min but partition '{part.name}' allows at "
            f"most {part.max_time_min} min (MaxTime): lower {keys}"
        )
    return out


def _memory(part: Partition, need: JobNeed) -> list[str]:
    """The job asks for more memory per node (sbatch --mem) than the partition's nodes have."""
    if not (need.mem_mb and part.node_mem_mb and max(part.node_mem_mb) < need.mem_mb):
        return []
    return [
        f"{need.what} asks SLURM for {need.mem_mb} MB per node (sbatch --mem: "
        f"{need.mem_key}), but the nodes of partition '{part.name}' have at most "
        f'{max(part.node_mem_mb)} MB: sbatch would refuse it ("Memory specification can not '
        f'be satisfied"); lower {need.mem_key.split(" (")[0]}'
    ]


def _nodes_down(part: Partition, need: JobNeed, fit: list[int]) -> list[str]:
    """The job's nodes would fit, but too few of them can start a job now (down, drained)."""
    up = [i for i in fit if part.can_start(i)]
    if len(up) >= need.nodes:
        return []
    return [
        f"{need.what} needs {need.nodes} node(s), but only {len(up)} node(s) of partition "
        f"'{part.name}' can start a job now: {'; '.join(part.unusable())}. Ask the cluster's "
        "admins (or `scontrol update nodename=<node> state=resume` once it is fixed), use "
        "another partition, or lower the largest grid.workers"
    ]


def preflight(
    cfg: Config,
    probe_partition: str | None = None,
    train_partition: str | None = None,
    train_runtime_min: int | None = None,
    training_only: bool = False,
    train_nodes: int | None = None,
    node_states: bool = True,
    profile_mem_mb: dict[str, int | None] | None = None,
    probe_points: int = 1,
) -> dict[str, Any]:
    """Check every job kind (or only training) against its partition (``None``: the
    cluster's default); with ``node_states``, only the nodes that can start a job now count
    (`tula launch` waits for lost nodes instead: :mod:`tula.production.nodes`). Returns what
    was checked (``probe_points``: as :func:`job_needs`); raises :class:`PreflightError`
    listing every problem, or
    :class:`ClusterUnreadable` when there is no controller to ask."""
    parts: dict[str | None, Partition] = {}
    checked, found = [], []
    needs = job_needs(cfg, train_runtime_min, train_nodes, profile_mem_mb, probe_points)
    for need in needs[-1:] if training_only else needs:
        name = train_partition if need.what.startswith("training") else probe_partition
        if name not in parts:
            parts[name] = read_partition(name)
        part = parts[name]
        found += problems(cfg, part, need, node_states)
        checked.append({**asdict(need), "partition": part.name})
    if found:
        raise PreflightError(
            "this grid cannot run on the cluster (checked with scontrol/sinfo before submitting "
            "anything):\n  - " + "\n  - ".join(found)
        )
    return {"partitions": {p.name: asdict(p) for p in parts.values()}, "jobs": checked}


def describe(report: dict[str, Any]) -> str:
    """The preflight's findings, a few lines for the terminal."""
    lines = []
    for p in report["partitions"].values():
        limit = "unlimited" if p["max_time_min"] is None else f"{p['max_time_min']} min"
        lines.append(
            f"partition '{p['name']}' ({p['state']}): {p['total_nodes']} node(s), up to "
            f"{max(p['node_cpus'], default=0)} CPUs and {max(p['node_gpus'], default=0)} GPU(s) "
            f"per node"
            + (f" ({max(p['node_mem_mb'])} MB of memory)" if p.get("node_mem_mb") else "")
            + f", time limit {limit}"
        )
        lost = Partition(**p).unusable()
        if lost:
            lines.append(f"  note: {'; '.join(lost)} (the other nodes are enough for now)")
    for j in report["jobs"]:
        rt = (
            "runtime checked when tula launch submits it"
            if j["runtime_min"] is None
            else f"{j['runtime_min']} min"
        )
        mem = f", {j['mem_mb']} MB" if j.get("mem_mb") else ""
        lines.append(
            f"  ok: {j['what']}: {j['nodes']} node(s) x {j['tasks_per_node']} worker(s), "
            f"{j['cpus_per_node']} CPUs, {j['gpus_per_node']} GPU(s){mem} per node, {rt} on "
            f"'{j['partition']}'"
        )
    return "\n".join(lines)


def read_profile(directory: str) -> dict[str, Any]:
    """The cluster settings of a Snakemake profile (``DIR/config.yaml``) that the jobs get:
    the probes' partition and account (default-resources), the training job's (set-resources
    for ``train``, else the defaults) and its runtime. A file that is missing or not a
    mapping, or a value of the wrong type, is an error naming the file and key."""
    path = Path(directory) / "config.yaml"
    if not path.is_file():
        raise PreflightError(
            f"profile {directory!r}: no {path} (a Snakemake profile is a directory with "
            "config.yaml)"
        )
    try:
        prof = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise PreflightError(f"profile {path}: not valid YAML: {exc}") from None
    if not isinstance(prof, dict):
        raise PreflightError(f"profile {path}: must be a mapping of Snakemake options")
    defaults = prof.get("default-resources") or {}
    train = (prof.get("set-resources") or {}).get("launch") or {}
    for key, block in (("default-resources", defaults), ("set-resources.launch", train)):
        if not isinstance(block, dict):
            raise PreflightError(f"profile {path}: {key} must be a mapping of resource: value")
        for name in ("runtime", "mem_mb"):
            if name in block and not isinstance(block[name], int):
                raise PreflightError(
                    f"profile {path}: {key}.{name} must be a whole number, not {block[name]!r}"
                )
    if prof.get("executor") not in (None, "slurm", "local"):
        raise PreflightError(
            f"profile {path}: executor {prof['executor']!r}: Tula runs under 'slurm' (or local)"
        )
    sets = prof.get("set-resources") or {}

    def resource(name: str, rule: str) -> Any:
        return (sets.get(rule) or {}).get(name, defaults.get(name))

    return {"executor": prof.get("executor"), **cluster_settings(resource)}


def cluster_settings(resource: Callable[[str, str], Any]) -> dict[str, Any]:
    """What Tula takes from a Snakemake profile, however it was read: ``resource(name, rule)``
    is the resource ``name`` that ``rule``'s jobs get (set-resources for the rule, else
    default-resources; None when unset). ``tula check --profile`` reads it from the profile's
    file (:func:`read_profile`); the workflow from Snakemake's own resource settings, which
    hold the command line's overrides too (rules/common.smk)."""
    return {
        "probe_partition": resource("slurm_partition", "probe"),
        "account": resource("slurm_account", "probe"),
        "train_partition": resource("slurm_partition", "launch"),
        "train_runtime_min": resource("runtime", "launch"),
        "mem_mb": {rule: resource("mem_mb", rule) for rule in ("memprobe", "probe")},
    }


def each_partition(
    table: dict[str, Planned],
    profile: dict[str, Any],
    describe_to: Callable[[str], None],
    **kw: Any,
) -> dict[str, dict[str, Any]]:
    """:func:`preflight` for every partition of the table (:func:`tula.partitions.table`): its
    probes on its probe partition, its training on its training partition (a listed one's:
    its own name; the profile's: as the profile and launch.slurm_partition say); ``kw`` as
    :func:`preflight`'s. Raises one :class:`PreflightError` naming every entry of
    cluster.partitions that fails; ``describe_to`` is given each partition's findings."""
    reports, found = {}, []
    for i, (name, part) in enumerate(table.items()):
        try:
            reports[name] = preflight(
                from_dict(part.config),
                probe_partition=part.probe_partition(profile),
                train_partition=part.train_partition(profile),
                **kw,
            )
        except PreflightError as err:
            found.append(f"cluster.partitions[{i}] ({name}): {err}" if part.listed else str(err))
            continue
        describe_to(f"{name + ': ' if part.listed else ''}{describe(reports[name])}")
    if found:
        raise PreflightError("\n".join(found))
    return reports
