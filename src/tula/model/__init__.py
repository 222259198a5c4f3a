"""The paper's equations, numpy/scipy only: the grid and search sets, memory (Eq. 3), step
time (Eq. 2) and training time (Eq. 4a), curve fitting and model choice, pricing (Eq. 4b),
the gradient noise scale and statistical efficiency, and the measurements table they are
fitted on. Nothing here imports torch or the other rooms of the package."""
