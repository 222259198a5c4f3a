"""The production job, in one room: the launcher on the login node (:mod:`.launcher`: attempts,
requeues, resume; :mod:`.relaunch`: the smaller batch after an OOM; :mod:`.replan`: the move on
drift), the job's folder (:mod:`.jobdir`), its record of attempts (:mod:`.attempts`),
submitit (:mod:`.submission`), the job's entry point (:mod:`.job`), the worker's training loop
(:mod:`.trainer`) with its records (:mod:`.records`), stops (:mod:`.stops`) and monitoring
(:mod:`.monitor`), and the check of the prediction against what the job paid (:mod:`.confirm`).

The launcher side (launcher, relaunch, replan, confirm, jobdir, attempts, submission, job)
imports no torch: ``tula launch`` runs on the login node. The worker side (trainer, records,
stops, monitor) runs inside the job's tasks and trains with :mod:`tula.runtime`'s one
training step. This module imports nothing."""
