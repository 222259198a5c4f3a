"""The one place that knows SLURM, a module for each thing asked of it (the preflight built on
them: :mod:`tula.preflight`):

- :mod:`~tula.slurm.controller`: asking the controller a command, and the error when none answers;
- :mod:`~tula.slurm.partition_info`: what a partition offers (nodes, CPUs, GPUs, memory, time
  limit, which nodes can start a job), parsed from ``scontrol``/``sinfo``;
- :mod:`~tula.slurm.shapes`: what a job of N workers asks for (nodes, tasks per node, CPUs,
  GPUs), as sbatch options and as Snakemake resources;
- :mod:`~tula.slurm.accounting`: what became of a job (``sacct``/``scontrol``: its state, its
  nodes, its tasks);
- :mod:`~tula.slurm.rendezvous`: where the workers of one job meet (inside an allocation, the
  first node, the port every task derives alike);
- :mod:`~tula.slurm.plugin_patch`: the narrowing of snakemake-executor-plugin-slurm's
  failed-node exclusion.
"""
