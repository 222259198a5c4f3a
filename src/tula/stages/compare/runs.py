"""The generalization suite's runs: one per (workload, B, method, seed) of ``compare.workloads``
x ``compare.batches`` x ``compare.methods`` x ``compare.seeds``, each named by its id (the
``run`` wildcard of ``rule compare_run``)."""

from __future__ import annotations

from dataclasses import dataclass

from tula import config as config_mod


@dataclass(frozen=True)
class Run:
    model: str
    dataset: str
    global_batch: int
    method: str
    seed: int

    @property
    def id(self) -> str:
        ds = self.dataset.replace(":", "_").replace("/", "_")
        return f"{self.model}__{ds}__B{self.global_batch}__{self.method}__s{self.seed}"


def runs(cfg: config_mod.Config) -> list[Run]:
    c = cfg.compare
    return [
        Run(w.model, w.dataset, b, m, s)
        for w in c.workloads
        for b in c.batches
        for s in range(c.seeds)
        for m in c.methods
    ]


def run_ids(cfg: config_mod.Config) -> list[str]:
    """The suite's run ids, in order (the ``run`` wildcard of ``rule compare_run``)."""
    return [run.id for run in runs(cfg)]


def find(cfg: config_mod.Config, run_id: str) -> Run:
    for run in runs(cfg):
        if run.id == run_id:
            return run
    raise ValueError(
        f"run '{run_id}' is not in the suite of config keys compare.workloads x compare.batches x "
        f"compare.methods x compare.seeds ({len(runs(cfg))} runs)"
    )
