"""What runs inside the workers, with torch: process groups, the one training step
(:mod:`replica`), the production trainer, the probe and memory-probe workers, the optimizers
(AGS and the baselines), data, networks, and the agreement of ranks on failures."""
