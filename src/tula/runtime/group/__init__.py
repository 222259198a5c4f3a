"""The data-parallel group: process groups under torchrun, srun or submitit, and the ranks'
agreement on which of them failed."""
