"""Starting the N worker processes of a probe or a memory probe, and reading what they wrote.

One worker command (``python -m tula.runtime.probe.probe_worker ...``) runs unchanged in both
places it is started from. The package, a module for each job:

- :mod:`~tula.workers.processes`: ``start`` runs the command as ``srun --ntasks=N`` inside a
  SLURM allocation with enough tasks (the probe rule's job), else under ``torchrun
  --standalone --nproc-per-node N`` (this machine), or the memory probe's one worker by itself
  (no agent: a group of one needs no rendezvous); each worker finds its rank in the variables
  srun or torchrun sets, or none (:func:`tula.runtime.group.dist.worker_env`).
  ``worker_environment`` is the environment of every worker, probe and production alike (the
  production job's tasks are started by submitit: ``tula.production.launcher``); each rank
  writes its result to ``<dir>/rank<r>.json`` (``result_path``), which the launcher collects
  after the workers exit, also when they failed;
- :mod:`~tula.workers.phases`: a probe's rank says which of its phases
  (:data:`tula.faults.PROBE_PHASES`) it has reached, so a probe stopped by
  ``probe.timeout_s`` says where each rank was;
- :mod:`~tula.workers.stacks`: every worker prints its threads' Python stacks to its log a
  little before the launcher's deadline, so its log shows the line it was on;
- :mod:`~tula.workers.args`: a worker entry point's command line.

No torch here: the launchers (``tula probe``, ``tula memprobe``) only start and collect.
"""
