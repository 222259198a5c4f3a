"""Generalization suite (paper §IV-D, Table I): test accuracy and time to a target accuracy
per model x batch x method, as a Snakemake fan-out (``rules/compare.smk``).

- ``rule compare_run`` (``tula compare run``): one job per run, i.e. per (workload, B, method, seed)
  in :func:`runs`. It is a real training with ``compare.workers`` workers, submitted like the
  production job (:func:`tula.production.launcher.train`: submitit, an sbatch job under the SLURM
  profile, local processes otherwise; requeued from its checkpoints) and running the same training
  step, under the config's ``train`` settings with ``train.method`` and the seed replaced. It writes
  ``runs/<id>/result.json``: the status, the final accuracies and every epoch's test accuracy and
  step time. A run that runs out of memory is a result (status ``oom``), not relaunched smaller: a
  cell is trained at its own B or not at all. Finished runs are Snakemake outputs; an interrupted
  run resumes from its checkpoint.
- ``rule compare`` (``tula compare aggregate``) reads every result.json and writes
  ``accuracy.csv`` (one row per run), ``table.md`` (mean ± std per cell, best per row in
  bold, AGS − LBT, and the median time to the target per cell) and ``heatmap.png``.

Time to target: the training-step time (``epoch_time_s``, evaluation excluded, as the step
model predicts) summed over the epochs up to the first whose test metric (``train.metric``,
accuracy by default) reaches the workload's target (``compare.workloads[].target_accuracy``,
else ``compare.target_fraction`` of the best mean final metric any cell of the workload
reached; for a metric where smaller is better, that best divided by the fraction).

The package, a module for each job: :mod:`~tula.stages.compare.runs` (the suite's runs and
their ids), :mod:`~tula.stages.compare.train` (training one run),
:mod:`~tula.stages.compare.collect` (accuracy.csv from the runs' results, time to target,
and the aggregate step),
:mod:`~tula.stages.compare.cells` (a cell's statistics over its seeds, under the metric's name
and goal), :mod:`~tula.stages.compare.table` (table.md) and :mod:`~tula.stages.compare.heatmap`
(heatmap.png).
"""
