"""The user's way of training, from torch's parts: the optimizer, its state and AGS (with its
refresh), the paper's methods, the schedule, the loss and the epoch metric."""
