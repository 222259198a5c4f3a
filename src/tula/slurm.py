"""The one place that knows SLURM: the shape of an N-worker job, the preflight, and every
``sacct``/``scontrol``/``sinfo`` call.

- :func:`job_shape` / :func:`job_resources`: what a job of N workers asks for (nodes, tasks
  per node, CPUs, GPUs), as sbatch options (the production job, through submitit) and as
  Snakemake resources (the probe and memory-probe rules);
- :func:`job_state`, :func:`job_tasks`, :func:`master_addr`, :func:`in_allocation`: what
  the launcher and the workers ask the controller;
- the preflight: can the partition run the jobs this grid needs?

Before anything is queued, ``tula check --cluster`` and the workflow (Snakemake's
``onstart``, under the SLURM executor) read the partition with ``scontrol show partition``
and ``sinfo`` (nodes, CPUs and GPUs per node, the time limit) and compare them with what
the memory probe, the probe jobs and the training job will ask for. A grid that cannot run
is refused with one error that lists every problem and the config keys that fix it,
instead of probe jobs that pend forever (``PartitionNodeLimit``) or an sbatch refusal
after the probes.

What a job asks for comes from the same functions that build its request
(:func:`job_resources` for the probes, :func:`job_shape` for the training job), so the
check and the submission cannot disagree.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tula.config import Config

UNLIMITED = ("UNLIMITED", "INFINITE", "NONE")


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


@dataclass(frozen=True)
class JobNeed:
    """What one job of the workflow asks SLURM for."""

    what: str
    nodes: int
    tasks_per_node: int
    cpus_per_node: int
    gpus_per_node: int
    runtime_min: int | None  # None: not known before the job is submitted


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
    """GPUs in a node's GRES (``gpu:4``, ``gpu:a100:4(S:0-1)``, ``gpu:a100:2,gpu:v100:2``, ``(null)``)."""
    total = 0
    for item in re.split(r",(?![^(]*\))", gres or ""):
        m = re.match(r"^gpu(?::[^:(]+)?:(\d+)", item.strip())
        if m:
            total += int(m.group(1))
    return total


def parse_partition(scontrol_line: str, sinfo_text: str) -> Partition:
    """A partition from ``scontrol show partition -o NAME`` (one line of Key=Value) and
    ``sinfo -h -N -p NAME -o '%N|%c|%G'`` (one line per node)."""
    fields = dict(kv.split("=", 1) for kv in scontrol_line.split() if "=" in kv)
    nodes: dict[str, tuple[int, int]] = {}
    for line in sinfo_text.splitlines():
        if line.strip():
            name, cpus, gres = (line.split("|") + ["", ""])[:3]
            nodes[name] = (int(re.sub(r"\D.*", "", cpus) or 0), gpus_of(gres))  # a node listed twice counts once
    max_nodes = fields.get("MaxNodes", "UNLIMITED")
    return Partition(
        name=fields.get("PartitionName", "?"),
        total_nodes=int(fields.get("TotalNodes", len(nodes))),
        max_nodes=None if max_nodes.upper() in UNLIMITED else int(max_nodes),
        max_time_min=parse_time_min(fields.get("MaxTime", "UNLIMITED")),
        node_cpus=[c for c, _ in nodes.values()],
        node_gpus=[g for _, g in nodes.values()],
        state=fields.get("State", "UP"),
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
            raise PreflightError(f"partition {name!r} does not exist on this cluster (it has: {', '.join(known)}): "
                                 "fix launch.slurm_partition in the config or slurm_partition in the profile")  # fmt: skip
    else:
        line = next((ln for ln in lines if " Default=YES " in f" {ln} "), None)
        if line is None:
            raise PreflightError("the cluster has no default partition: set slurm_partition in the profile "
                                 "(default-resources) or launch.slurm_partition in the config")  # fmt: skip
    part_name = line.split()[0].split("=", 1)[1]
    return parse_partition(line, _run(["sinfo", "-h", "-N", "-p", part_name, "-o", "%N|%c|%G"]))


def probe_runtime_min(cfg: Config) -> int:
    """Minutes a (memory) probe job asks for: probe.timeout_s and five minutes for start-up."""
    return int(cfg.probe.timeout_s // 60) + 5


def job_needs(cfg: Config, train_runtime_min: int | None, train_nodes: int | None = None) -> list[JobNeed]:
    """The largest job of each kind the workflow can submit: the memory probe (one worker),
    the probe at the largest grid N (every N is probed in a full search, the corners in a
    partial one, so the largest always is) and training at that N (or at ``train_nodes``:
    `tula launch` knows the N it trains at)."""
    n = max(cfg.grid.nodes)
    res = job_resources(cfg, n, probe_runtime_min(cfg))
    per_node = math.ceil(n / res["nodes"])
    gpus = per_node if res["gres"] else 0
    threads = cfg.hardware.threads_per_worker
    tn = train_nodes or n
    shape = job_shape(cfg, tn)
    return [
        JobNeed("the memory probe (1 worker)", 1, 1, threads, 1 if res["gres"] else 0, probe_runtime_min(cfg)),
        JobNeed(f"the probe at N={n}", res["nodes"], per_node, per_node * threads, gpus, probe_runtime_min(cfg)),
        JobNeed(f"training at N={tn}", shape.nodes, shape.tasks_per_node, shape.tasks_per_node * shape.cpus_per_task,
                shape.gpus_per_node, train_runtime_min),  # fmt: skip
    ]


def problems(cfg: Config, part: Partition, need: JobNeed) -> list[str]:
    """Why ``part`` cannot run ``need`` (empty: it can), naming the config keys to change."""
    out: list[str] = []
    wpn, threads = cfg.grid.workers_per_node, cfg.hardware.threads_per_worker
    fit = [i for i in range(len(part.node_cpus))
           if part.node_cpus[i] >= need.cpus_per_node and part.node_gpus[i] >= need.gpus_per_node]  # fmt: skip
    limit = min(part.total_nodes, part.max_nodes or part.total_nodes)
    if need.nodes > limit:
        out.append(f"{need.what} needs {need.nodes} node(s) ({need.tasks_per_node} worker(s) per node; "
                   f"grid.workers_per_node={wpn}), but partition '{part.name}' has {part.total_nodes} node(s)"
                   + (f" and allows {part.max_nodes} per job" if part.max_nodes else "")
                   + ": lower the largest grid.nodes, raise grid.workers_per_node if the nodes have the GPUs and "
                   "CPUs, or use a larger partition")  # fmt: skip
    elif len(fit) < need.nodes:
        if need.gpus_per_node and max(part.node_gpus, default=0) < need.gpus_per_node:
            out.append(f"{need.what} puts {need.tasks_per_node} worker(s) on a node and needs {need.gpus_per_node} "
                       f"GPU(s) per node (grid.workers_per_node={wpn}, hardware.device=cuda), but the nodes of "
                       f"partition '{part.name}' have at most {max(part.node_gpus, default=0)}: set "
                       "grid.workers_per_node to the GPUs per node")  # fmt: skip
        if max(part.node_cpus, default=0) < need.cpus_per_node:
            out.append(f"{need.what} needs {need.cpus_per_node} CPUs per node ({need.tasks_per_node} worker(s) x "
                       f"hardware.threads_per_worker={threads}), but the nodes of partition '{part.name}' have at "
                       f"most {max(part.node_cpus, default=0)}: lower hardware.threads_per_worker or "
                       "grid.workers_per_node")  # fmt: skip
        if not out:
            out.append(f"{need.what} needs {need.nodes} node(s) with {need.cpus_per_node} CPUs and "
                       f"{need.gpus_per_node} GPU(s) each, but only {len(fit)} node(s) of partition '{part.name}' "
                       "have that: lower the largest grid.nodes or grid.workers_per_node")  # fmt: skip
    if need.runtime_min is not None and part.max_time_min is not None and need.runtime_min > part.max_time_min:
        keys = ("probe.timeout_s (a probe job asks for it + 5 min)" if "probe" in need.what else
                "launch.timeout_min, or the train rule's runtime in the profile (set-resources)")  # fmt: skip
        out.append(f"{need.what} asks for {need.runtime_min} min but partition '{part.name}' allows at most "
                   f"{part.max_time_min} min (MaxTime): lower {keys}")  # fmt: skip
    return out


def preflight(cfg: Config, probe_partition: str | None = None, train_partition: str | None = None,
              train_runtime_min: int | None = None, training_only: bool = False,
              train_nodes: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Check every job kind (or only training) against its partition (``None``: the
    cluster's default). Returns what was checked; raises :class:`PreflightError` listing
    every problem, or :class:`ClusterUnreadable` when there is no controller to ask."""
    parts: dict[str | None, Partition] = {}
    checked, found = [], []
    needs = job_needs(cfg, train_runtime_min, train_nodes)
    for need in needs[-1:] if training_only else needs:
        name = train_partition if need.what.startswith("training") else probe_partition
        if name not in parts:
            parts[name] = read_partition(name)
        part = parts[name]
        found += problems(cfg, part, need)
        checked.append({**asdict(need), "partition": part.name})
    if found:
        raise PreflightError("this grid cannot run on the cluster (checked with scontrol/sinfo before submitting "
                             "anything):\n  - " + "\n  - ".join(found))  # fmt: skip
    return {"partitions": {p.name: asdict(p) for p in parts.values()}, "jobs": checked}


def describe(report: dict[str, Any]) -> str:
    """The preflight's findings, a few lines for the terminal."""
    lines = []
    for p in report["partitions"].values():
        limit = "unlimited" if p["max_time_min"] is None else f"{p['max_time_min']} min"
        lines.append(f"partition '{p['name']}' ({p['state']}): {p['total_nodes']} node(s), up to "
                     f"{max(p['node_cpus'], default=0)} CPUs and {max(p['node_gpus'], default=0)} GPU(s) per node, "
                     f"time limit {limit}")  # fmt: skip
    for j in report["jobs"]:
        rt = "runtime checked when tula launch submits it" if j["runtime_min"] is None else f"{j['runtime_min']} min"
        lines.append(f"  ok: {j['what']}: {j['nodes']} node(s) x {j['tasks_per_node']} worker(s), "
                     f"{j['cpus_per_node']} CPUs and {j['gpus_per_node']} GPU(s) per node, {rt} on '{j['partition']}'")
    return "\n".join(lines)


def read_profile(directory: str) -> dict[str, Any]:
    """The cluster settings of a Snakemake profile (``DIR/config.yaml``) that the jobs get:
    the probes' partition and account (default-resources), the training job's (set-resources
    for ``train``, else the defaults) and its runtime. A file that is missing or not a
    mapping, or a value of the wrong type, is an error naming the file and key."""
    path = Path(directory) / "config.yaml"
    if not path.is_file():
        raise PreflightError(f"profile {directory!r}: no {path} (a Snakemake profile is a directory with config.yaml)")
    try:
        prof = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise PreflightError(f"profile {path}: not valid YAML: {exc}") from None
    if not isinstance(prof, dict):
        raise PreflightError(f"profile {path}: must be a mapping of Snakemake options")
    defaults = prof.get("default-resources") or {}
    train = (prof.get("set-resources") or {}).get("train") or {}
    for key, block in (("default-resources", defaults), ("set-resources.train", train)):
        if not isinstance(block, dict):
            raise PreflightError(f"profile {path}: {key} must be a mapping of resource: value")
        for name in ("runtime", "mem_mb"):
            if name in block and not isinstance(block[name], int):
                raise PreflightError(f"profile {path}: {key}.{name} must be a whole number, not {block[name]!r}")
    if prof.get("executor") not in (None, "slurm", "local"):
        raise PreflightError(f"profile {path}: executor {prof['executor']!r}: Tula runs under 'slurm' (or local)")
    return {
        "executor": prof.get("executor"),
        "probe_partition": defaults.get("slurm_partition"),
        "account": defaults.get("slurm_account"),
        "train_partition": train.get("slurm_partition", defaults.get("slurm_partition")),
        "train_runtime_min": train.get("runtime", defaults.get("runtime")),
    }


# -- the shape of a job ---------------------------------------------------------------------


@dataclass(frozen=True)
class JobShape:
    """sbatch shape of an N-worker job: one task per GPU (worker)."""

    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int


def job_shape(cfg: Config, n_workers: int) -> JobShape:
    """The training job's shape (submitit asks for the same task count on every node)."""
    wpn = cfg.grid.workers_per_node
    if n_workers % wpn and n_workers > wpn:
        per_node = 1
    else:
        per_node = min(n_workers, wpn)
    gpus = per_node if cfg.hardware.device == "cuda" else 0
    return JobShape(n_workers // per_node, per_node, cfg.hardware.threads_per_worker, gpus)


def job_resources(cfg: Config, nodes: int, runtime_min: int | None = None,
                  exclusive: bool = False) -> dict[str, int | str | None]:  # fmt: skip
    """What one SLURM job for N workers asks for (Snakemake resources -> sbatch flags).

    ============== ==================================== =========================
    resource       value                                sbatch flag
    ============== ==================================== =========================
    tasks          N (one task per worker / GPU)        --ntasks=N
    nodes          ceil(N / grid.workers_per_node)      --nodes
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
    ``hardware.device`` is ``cuda`` (``auto`` cannot know the cluster's nodes).
    """
    wpn = cfg.grid.workers_per_node
    n_nodes = -(-nodes // wpn)
    return {
        "tasks": nodes,
        "nodes": n_nodes,
        "mpi": "srun" if nodes > 1 else None,
        "cpus_per_task": cfg.hardware.threads_per_worker,
        "gres": f"gpu:{min(nodes, wpn)}" if cfg.hardware.device == "cuda" else None,
        "runtime": runtime_min,
        "slurm_extra": "--exclusive" if exclusive else None,
    }


# -- what the launcher and the workers ask the controller -----------------------------------


def job_state(job_id: str) -> str:
    """A job's state: sacct's, else the controller's (`scontrol show job`), since accounting
    records a job a moment after its submission; '' when neither knows it."""
    if shutil.which("sacct"):
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True)
        if out.stdout.split():
            return out.stdout.split()[0]
    if shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
        for item in out.stdout.split():
            if item.startswith("JobState="):
                return item.split("=", 1)[1]
    return ""


def job_tasks(job_id: str) -> int:
    """Tasks allocated to a SLURM job, from ``scontrol show job`` (NumTasks); 1 if unknown."""
    if not shutil.which("scontrol"):
        return 1
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False).stdout
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


def master_port(job_id: str) -> int:
    """A port every task of one job derives alike: 15000 + (job id mod 20000)."""
    return 15000 + int(job_id) % 20000
