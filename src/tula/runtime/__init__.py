"""What runs inside the workers, with torch, in rooms by job, each importing only the rooms
below it: ``probe`` (the probe and memory-probe workers and what they measure) > ``step`` (the
one training step, :mod:`tula.runtime.step.replica`, and its parts) > ``train`` (the optimizer,
AGS, the methods, the schedule, loss and metric) > ``input`` (datasets, loaders, the device
feed) > ``group`` (process groups, the ranks' agreement) and ``timer`` (the step timer)."""
