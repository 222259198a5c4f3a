"""The shape of an N-worker job (nodes, tasks per node, CPUs, GPUs): one shape for the memory
probe, the probes, the production job and the suite's runs, as sbatch options
(:func:`job_shape`, through submitit) and as Snakemake resources (:func:`job_resources`)."""

from __future__ import annotations

from dataclasses import dataclass

from tula.config import Config


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
