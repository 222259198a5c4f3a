"""What a SLURM partition offers, as the controller describes it now: its nodes, their CPUs, GPUs,
memory and states, its per-job node limit and time limit (:func:`read_partition`), parsed from
``scontrol show partition`` and ``sinfo`` text (:func:`parse_partition`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from tula.slurm import controller

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


def read_partition(name: str | None) -> Partition:
    """The named partition, or the cluster's default one, as the controller describes it now."""
    lines = [
        ln
        for ln in controller.ask(["scontrol", "show", "partition", "-o"]).splitlines()
        if ln.strip()
    ]
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
    return parse_partition(
        line, controller.ask([*sinfo, "%N|%c|%G|%t|%E"]), controller.ask([*sinfo, "%N|%m"])
    )
