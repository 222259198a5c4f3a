"""The probes inside their workers: the probe worker and the memory probe's, the timed steps
at a point (its timing, its state, rank 0's measurement), the compute sweep at other local
batches, the step's memory terms and peak, the gradient noise scale, and the estimate from the
model alone."""
