"""The step timer: one timer for every timed step, the clocks it reads per device, and the
precision of a series of step times."""
