"""The one place that knows SLURM: the shape of an N-worker job and every
``sacct``/``scontrol``/``sinfo`` call (the preflight built on them: :mod:`tula.preflight`).

- :func:`job_shape` / :func:`job_resources`: what a job of N workers asks for (nodes, tasks
  per node, CPUs, GPUs), as sbatch options (the production job, through submitit) and as
  Snakemake resources (the probe and memory-probe rules);
- :func:`job_state`, :func:`job_tasks`, :func:`master_addr`, :func:`in_allocation`: what
  the launcher and the workers ask the controller;
- :func:`read_partition`: a partition's nodes, CPUs and GPUs per node and time limit.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from tula.config import Config

UNLIMITED = ("UNLIMITED", "INFINITE", "NONE")
# sinfo's short states (%t) of a node that will not start a job
UNUSABLE = (
    "down",
    "drain",
    "drng",
    "drained",
    "draining",
    "fail",
    "failg",
    "maint",
    "inval",
    "futr",
)


class PreflightError(Exception):
    """The partition cannot run some job of this grid (the message lists what and why)."""


class ClusterUnreadable(Exception):
    """No SLURM controller to ask (no scontrol on PATH, or it does not answer)."""


@dataclass(frozen=True)
class Partition:
    name: str
    total_nodes: int
    max_nodes: int | None  # per job; None: unlimited
    max_time_min: int | None  # None: unlimited
    node_cpus: list[int] = field(default_factory=list)  # per node of the partition
    node_gpus: list[int] = field(default_factory=list)
    state: str = "UP"
    node_names: list[str] = field(default_factory=list)
    node_states: list[str] = field(default_factory=list)  # sinfo's %t: idle, mix, drain, down*
    node_reasons: list[str] = field(default_factory=list)  # sinfo's %E: why an admin set it
    node_mem_mb: list[int] = field(default_factory=list)  # sinfo's %m (RealMemory); [] unknown

    def can_start(self, i: int) -> bool:
        """Whether node ``i`` can start a job now (or once it is free): not down, drained,
        draining, failing, in maintenance, invalid or not answering (sinfo's ``*``)."""
        state = (self.node_states[i] if i < len(self.node_states) else "idle").lower()
        return not (state.endswith("*") or state.rstrip("~#!%$@^-") in UNUSABLE)

    def unusable_names(self) -> list[str]:
        return [n for i, n in enumerate(self.node_names) if not self.can_start(i)]

    def unusable(self) -> list[str]:
        """The nodes that cannot start a job, each with its state and the admin's reason."""
        out = []
        for i, name in enumerate(self.node_names):
            if not self.can_start(i):
                why = self.node_reasons[i] if i < len(self.node_reasons) else ""
                out.append(
                    f"{name} is {self.node_states[i]}"
                    + (f" (reason: {why})" if why and why != "none" else "")
                )
        return out


def parse_time_min(text: str) -> int | None:
    """Minutes of a SLURM time limit (``MaxTime``): ``UNLIMITED``, ``MM``, ``MM:SS``,
    ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``; seconds round up."""
    text = text.strip()
    if text.upper() in UNLIMITED:
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        h, m, s = parts
    else:
        h, (m, s) = 0, (parts + [0])[:2]
    return (int(days or 0) * 24 + h) * 60 + m + math.ceil(s / 60)


def gpus_of(gres: str) -> int:
    """GPUs in a node's GRES (``gpu:4``, ``gpu:a100:4(S:0-1)``, ``gpu:a100:2,gpu:v100:2``,
    ``(null)``)."""
    total = 0
    for item in re.split(r",(?![^(]*\))", gres or ""):
        m = re.match(r"^gpu(?::[^:(]+)?:(\d+)", item.strip())
        if m:
            total += int(m.group(1))
    return total


def parse_partition(scontrol_line: str, sinfo_text: str, memory_text: str = "") -> Partition:
    """A partition from ``scontrol show partition -o NAME`` (one line of Key=Value) and
    ``sinfo -h -N -p NAME -o '%N|%c|%G|%t|%E'`` (one line per node; state and reason may be
    left out: the node is then taken as up); ``memory_text``: ``sinfo -h -N -p NAME -o
    '%N|%m'``, each node's memory in MB (left out: not known, not checked)."""
    memory = {}
    for line in memory_text.splitlines():
        name, _, mb = line.strip().partition("|")
        if name and mb.strip().isdigit():
            memory[name] = int(mb)
    fields = dict(kv.split("=", 1) for kv in scontrol_line.split() if "=" in kv)
    nodes: dict[str, tuple[int, int, str, str]] = {}
    for line in sinfo_text.splitlines():
        if line.strip():
            name, cpus, gres, state, reason = (line.split("|", 4) + ["", "", "idle", ""])[:5]
            nodes[name] = (
                int(re.sub(r"\D.*", "", cpus) or 0),
                gpus_of(gres),
                state.strip() or "idle",
                reason.strip(),
            )  # a node listed twice counts once
    max_nodes = fields.get("MaxNodes", "UNLIMITED")
    return Partition(
        name=fields.get("PartitionName", "?"),
        total_nodes=int(fields.get("TotalNodes", len(nodes))),
        max_nodes=None if max_nodes.upper() in UNLIMITED else int(max_nodes),
        max_time_min=parse_time_min(fields.get("MaxTime", "UNLIMITED")),
        node_cpus=[n[0] for n in nodes.values()],
        node_gpus=[n[1] for n in nodes.values()],
        state=fields.get("State", "UP"),
        node_names=list(nodes),
        node_states=[n[2] for n in nodes.values()],
        node_reasons=[n[3] for n in nodes.values()],
        node_mem_mb=[memory[n] for n in nodes] if memory and set(nodes) <= set(memory) else [],
    )


def _run(cmd: list[str]) -> str:
    if not shutil.which(cmd[0]):
        raise ClusterUnreadable(f"{cmd[0]} is not on PATH (not on a SLURM login node?)")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise ClusterUnreadable(f"`{' '.join(cmd)}` failed: {(out.stderr or out.stdout).strip()}")
    return out.stdout


def read_partition(name: str | None) -> Partition:
    """The named partition, or the cluster's default one, as the controller describes it now."""
    lines = [ln for ln in _run(["scontrol", "show", "partition", "-o"]).splitlines() if ln.strip()]
    if name:
        line = next((ln for ln in lines if ln.startswith(f"PartitionName={name} ")), None)
        if line is None:
            known = [ln.split()[0].split("=", 1)[1] for ln in lines]
            raise PreflightError(
                f"partition {name!r} does not exist on this cluster (it has: {', '.join(known)}): "
                "fix launch.slurm_partition in the config or slurm_partition in the profile"
            )
    else:
        line = next((ln for ln in lines if " Default=YES " in f" {ln} "), None)
        if line is None:
            raise PreflightError(
                "the cluster has no default partition: set slurm_partition in the profile "
                "(default-resources) or launch.slurm_partition in the config"
            )
    part_name = line.split()[0].split("=", 1)[1]
    sinfo = ["sinfo", "-h", "-N", "-p", part_name, "-o"]
    return parse_partition(line, _run([*sinfo, "%N|%c|%G|%t|%E"]), _run([*sinfo, "%N|%m"]))


# -- the shape of a job ---------------------------------------------------------------------


@dataclass(frozen=True)
class JobShape:
    """sbatch shape of an N-worker job: one task per GPU (worker)."""

    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int


def job_shape(cfg: Config, n_workers: int) -> JobShape:
    """The shape of every job of N workers (memory probe, probes, production, the suite's
    runs): as many workers on a node as it holds (cluster.workers_per_node), the same number
    on every node (submitit asks for tasks per node). N above one node is a whole number of
    nodes (the config refuses any other); N below it shares one node.

    GPUs (one per worker) are asked for when the job runs on CUDA: ``hardware.device: cuda``,
    or ``auto`` where :func:`tula.devices.for_config` found GPUs on the partition (the workflow
    and `tula launch` write its decision into the config the jobs read)."""
    wpn = cfg.cluster.workers_per_node
    if n_workers > wpn and n_workers % wpn:
        raise ValueError(
            f"config key 'grid.workers': N={n_workers} does not fill whole nodes of "
            f"cluster.workers_per_node={wpn}"
        )
    per_node = min(n_workers, wpn)
    gpus = per_node if cfg.hardware.device == "cuda" else 0
    return JobShape(n_workers // per_node, per_node, cfg.hardware.threads_per_worker, gpus)


def job_resources(
    cfg: Config, n_workers: int, runtime_min: int | None = None, exclusive: bool = False
) -> dict[str, int | str | None]:
    """What the SLURM job of an N-worker probe asks for, as Snakemake resources (which
    snakemake-executor-plugin-slurm turns into sbatch flags): :func:`job_shape`'s, the shape
    of the production job at the same N, so a probe times the layout it predicts.

    ============== ==================================== =========================
    resource       value                                sbatch flag
    ============== ==================================== =========================
    tasks          N (one task per worker / GPU)        --ntasks=N
    nodes          the shape's nodes                    --nodes
    mpi            "srun" when N > 1, else unset        (the job's command is run
                                                         as is; tula starts the N
                                                         tasks with srun itself)
    cpus_per_task  hardware.threads_per_worker          --cpus-per-task
    gres           "gpu:<GPUs per node>" on CUDA        --gres
    runtime        minutes (None: the profile's)        -t
    slurm_extra    "--exclusive" with ``exclusive``     --exclusive (whole nodes:
                   (probe jobs, probe.exclusive)         no other job shares a
                                                         timing)
    ============== ==================================== =========================

    A value of None leaves the resource unset. GPUs are requested when
    ``hardware.device`` is ``cuda`` (``auto`` is decided before, by :mod:`tula.devices`).
    """
    shape = job_shape(cfg, n_workers)
    return {
        "tasks": n_workers,
        "nodes": shape.nodes,
        "mpi": "srun" if n_workers > 1 else None,
        "cpus_per_task": shape.cpus_per_task,
        "gres": f"gpu:{shape.gpus_per_node}" if shape.gpus_per_node else None,
        "runtime": runtime_min,
        "slurm_extra": "--exclusive" if exclusive else None,
    }


# -- what the launcher and the workers ask the controller -----------------------------------


def job_state(job_id: str) -> str:
    """A job's state: sacct's, else the controller's (`scontrol show job`), since accounting
    records a job a moment after its submission; '' when neither knows it."""
    if shutil.which("sacct"):
        out = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True
        )
        if out.stdout.split():
            return out.stdout.split()[0]
    if shutil.which("scontrol"):
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True
        )
        for item in out.stdout.split():
            if item.startswith("JobState="):
                return item.split("=", 1)[1]
    return ""


def job_nodes(job_id: str) -> list[str]:
    """The nodes a job ran on (its last run, from sacct), by name; [] when unknown."""
    try:
        listed = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "NodeList"]).split()
        if not listed or listed[0] in ("None", "(null)", "None assigned"):
            return []
        return _run(["scontrol", "show", "hostnames", listed[0]]).split()
    except (ClusterUnreadable, subprocess.TimeoutExpired):
        return []


def job_tasks(job_id: str) -> int:
    """Tasks allocated to a SLURM job, from ``scontrol show job`` (NumTasks); 1 if unknown."""
    if not shutil.which("scontrol"):
        return 1
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False
    ).stdout
    for item in out.split():
        if item.startswith("NumTasks="):
            return int(item.split("=", 1)[1])
    return 1


def in_allocation(nproc: int, environ: os._Environ | dict | None = None) -> bool:
    """True inside a SLURM job (sbatch/salloc, not yet a job step) with at least nproc tasks.

    Snakemake's SLURM executor clears every SLURM_* variable but SLURM_JOB_ID before it runs
    a rule's command inside a job, so without SLURM_NTASKS the task count comes from scontrol.
    """
    env = os.environ if environ is None else environ
    if "SLURM_JOB_ID" not in env or "SLURM_STEP_ID" in env:
        return False
    if "SLURM_NTASKS" in env:
        return int(env["SLURM_NTASKS"]) >= nproc
    return nproc > 1 and job_tasks(env["SLURM_JOB_ID"]) >= nproc


def master_addr(nodelist: str) -> str:
    """First host of a SLURM node list (``node[01-04],gpu7`` -> ``node01``)."""
    if shutil.which("scontrol"):
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=False
        ).stdout.split()
        if out:
            return out[0]
    # Fallback parser for the common forms when scontrol is not on PATH.
    first = nodelist.split(",")[0]
    if "[" in first:
        prefix, rest = first.split("[", 1)
        first = prefix + rest.split("-")[0].split(",")[0].rstrip("]")
    return first


EPHEMERAL_LOW = 32768  # Linux's default net.ipv4.ip_local_port_range starts here
PORT_BASE = 10000


def master_port(job_id: str) -> int:
    """A port every task of one job derives alike from its job id: ``10000 + (digits of the
    id mod 22768)``, below Linux's ephemeral range (32768-60999 by default). A port in that
    range can be held at any moment by an outgoing connection on the node (submitit's own
    choice, a random port in 20000-60000, was: a relaunched job failed with EADDRINUSE in CI).
    An array task's id (``123_4``) counts its digits."""
    return PORT_BASE + int(re.sub(r"\D", "", str(job_id))) % (EPHEMERAL_LOW - PORT_BASE)


# -- snakemake-executor-plugin-slurm's failed-node exclusion ------------------------------


def keep_exclusions_to_named_nodes() -> None:
    """snakemake-executor-plugin-slurm (2.8.0) excludes, after a job ends NODE_FAIL, every node
    sacct lists for it from all later submissions (``--exclude=``). Three things break Tula
    there: a job SLURM requeued lists ``None assigned``, which goes into sbatch's command line
    unquoted, so every later sbatch fails (snakemake/snakemake-executor-plugin-slurm#485); a
    two-node probe's healthy node is excluded with the dead one; and while the dead node is
    down, a two-node job that excludes it asks for more nodes than the partition has, which
    sbatch rejects ("Requested node configuration is not available") where SLURM would
    otherwise hold it until the node is back. SLURM starts no job on a node it marks down or
    drained, so that exclusion adds nothing SLURM does not do already. Until the plugin fixes
    it, each submission excludes only the nodes the user named (its ``exclude_failed_nodes``
    setting), none added after a failure."""
    try:
        import snakemake_executor_plugin_slurm as plugin  # only under the SLURM executor: optional
    except ImportError:
        return
    submit = getattr(plugin, "get_submit_command", None)
    if submit is None or submit.__name__ == "narrowed_submit_command":
        return

    def narrowed_submit_command(job, params, settings=None, failed_nodes=None, **kw):
        named = getattr(settings, "exclude_failed_nodes", None) or ""
        own = {n.strip() for n in named.split(",") if n.strip()}
        return submit(job, params, settings=settings, failed_nodes=own, **kw)

    plugin.get_submit_command = narrowed_submit_command
