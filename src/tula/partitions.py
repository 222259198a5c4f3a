"""The partitions a config plans on, as a table: one row per SLURM partition.

Every partition is planned as a config of its own -- the user's config with its entry laid over
it (:func:`config_for`) -- so its memory probe, probes, fits, predictions, queue and choice run
under results/partitions/<name>/ with its own config snapshot, one ``{partition}`` wildcard of
the workflow's rules (rules/common.smk). The choice across them is :mod:`tula.model.across`
(``tula combine``), and a table of one chooses its one partition. A config without
``cluster.partitions`` is a table of one (:func:`table`), named from the profile: its probes
and training go where the profile sends them, as before.

What an entry can change, and where it lands in its partition's config:

- ``gpu`` -> hardware.gpu (the memory budget follows it unless ``device_memory_gb`` is
  given); an entry without ``gpu`` is a CPU partition: hardware.gpu null;
- ``device_memory_gb`` -> hardware.device_memory_gb;
- ``workers_per_node`` -> cluster.workers_per_node;
- ``max_nodes`` -> grid.workers keeps only the N whose nodes the partition holds;
- ``per_worker_hour`` -> pricing.per_worker_hour (pricing.model worker_hour), or
  ``per_node_hour`` -> pricing.per_node_hour (pricing.model node_hour);
- ``name`` and ``account`` -> launch.slurm_partition and launch.slurm_account.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SNAPSHOT_DIR = ".snakemake/tula/partitions"
RESULTS_DIR = "results/partitions"
# a table of one, where the profile names no partition: the cluster's default (or this machine)
DEFAULT_NAME = "default"
# what results/ held before every partition had a folder of its own (results/partitions/<name>/)
OLD_LAYOUT = ("probes", "logs/probe", "benchmarks/probe", "benchmarks/memprobe.tsv")


def entries(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The config's partition entries (validated dict), in the order written."""
    return list((d.get("cluster") or {}).get("partitions") or [])


def names(d: dict[str, Any]) -> list[str]:
    return [e["name"] for e in entries(d)]


def snapshot_path(name: str) -> str:
    """Where the workflow writes the config partition ``name``'s jobs read."""
    return f"{SNAPSHOT_DIR}/{name}.json"


def results_dir(name: str) -> str:
    return f"{RESULTS_DIR}/{name}"


def _nodes_hold(workers: int, wpn: int, max_nodes: int | None) -> bool:
    nodes = -(-workers // wpn)
    return max_nodes is None or nodes <= max_nodes


def config_for(d: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The config of partition ``entry``: ``d`` (a validated config) with the entry laid over
    it and its list of partitions emptied. To be validated again (:func:`problems` does,
    naming the entry)."""
    out = copy.deepcopy(d)
    cl, hw, pr, la = out["cluster"], out["hardware"], out["pricing"], out["launch"]
    cl["partitions"] = []
    cl["workers_per_node"] = entry.get("workers_per_node") or cl["workers_per_node"]
    hw["gpu"] = entry.get("gpu")
    # the memory budget is decided again from this partition's GPU (config_rules.device_memory)
    hw.pop("device_memory_why", None)
    if "device_memory_gb" in entry:
        hw["device_memory_gb"] = entry["device_memory_gb"]
    elif entry.get("gpu") is not None or d["hardware"].get("gpu") is not None:
        hw.pop(
            "device_memory_gb", None
        )  # the entry's GPU's, or the default's, not the config's GPU's
    wpn, max_nodes = cl["workers_per_node"], entry.get("max_nodes")
    out["grid"]["workers"] = [n for n in d["grid"]["workers"] if _nodes_hold(n, wpn, max_nodes)]
    if entry.get("per_node_hour") is not None:
        pr["model"], pr["per_node_hour"] = "node_hour", entry["per_node_hour"]
    elif entry.get("per_worker_hour") is not None:
        pr["model"], pr["per_worker_hour"] = "worker_hour", entry["per_worker_hour"]
        pr["per_node_hour"] = None
    la["slurm_partition"] = entry["name"]
    if entry.get("account"):
        la["slurm_account"] = entry["account"]
    return out


def problems(d: dict[str, Any], validate: Callable[[dict, str], dict]) -> list[str]:
    """What is wrong with ``cluster.partitions`` of the validated config ``d``, each naming
    its entry: a name given twice, both prices, no grid.workers value the partition's nodes
    hold, and whatever the partition's own config gets wrong (``validate``, e.g. a GPU name
    Tula does not know)."""
    out: list[str] = []
    seen: set[str] = set()
    for i, e in enumerate(entries(d)):
        where = f"config key 'cluster.partitions[{i}]' ({e['name']})"
        if e["name"] in seen:
            out.append(f"{where}: the partition is listed twice; list each once")
        seen.add(e["name"])
        if e.get("per_worker_hour") is not None and e.get("per_node_hour") is not None:
            out.append(f"{where}: give one price, per_worker_hour or per_node_hour, not both")
            continue
        derived = config_for(d, e)
        if not derived["grid"]["workers"]:
            out.append(
                f"{where}: max_nodes={e.get('max_nodes')} holds none of grid.workers "
                f"{d['grid']['workers']} at {derived['cluster']['workers_per_node']} workers "
                "per node; raise max_nodes or remove the entry"
            )
            continue
        try:
            validate(derived, f"partition {e['name']}")
        except ValueError as err:
            said = str(err).split("\n", 1)[-1].replace("  - config key", "config key")
            said = said.replace("config key 'hardware.gpu'", "its gpu")
            out.append(f"{where}: {said}")
    return out


@dataclass(frozen=True)
class Planned:
    """One row of the table: ``name`` (its folder under results/partitions/ and its value of
    the ``{partition}`` wildcard), its ``config`` (validated dict) and whether it is an entry
    of ``cluster.partitions`` (``listed``: its jobs go to it by name) or the profile's."""

    name: str
    config: dict[str, Any]
    listed: bool

    def probe_partition(self, profile: dict[str, Any]) -> str | None:
        """The SLURM partition of its memory probe and probes (None: the cluster's default)."""
        return self.name if self.listed else profile.get("probe_partition")

    def train_partition(self, profile: dict[str, Any]) -> str | None:
        """The SLURM partition of its production job (a listed entry's is its own name)."""
        return self.config["launch"]["slurm_partition"] or profile.get("train_partition")


def table(d: dict[str, Any], profile: dict[str, Any]) -> dict[str, Planned]:
    """The partitions ``d`` (validated, without problems) plans on, by name: each entry of
    cluster.partitions, or one named after the profile's probe partition (else
    :data:`DEFAULT_NAME`) whose config is ``d`` itself."""
    if entries(d):
        return {e["name"]: Planned(e["name"], config_for(d, e), True) for e in entries(d)}
    name = profile.get("probe_partition") or DEFAULT_NAME
    return {name: Planned(name, d, False)}


def stale(results: str | Path, names: list[str]) -> list[str]:
    """What under ``results`` this table will not read, each said with what to do: a
    partition's folder not in ``names``, and the files of the layout before every partition
    had a folder of its own. Nothing is removed; nothing of them is mixed into this run."""
    root = Path(results)
    out = [
        f"{p} is another partition's (not in this config's table: {', '.join(names)}); "
        "not read -- remove it, or plan that partition again"
        for p in sorted((root / "partitions").glob("*/"))
        if p.is_dir() and p.name not in names
    ]
    old = [str(root / f) for f in OLD_LAYOUT if (root / f).exists()]
    if old:
        out.append(
            f"{', '.join(old)}: from Tula's layout before results/partitions/<name>/; "
            "not read -- remove them"
        )
    return out
