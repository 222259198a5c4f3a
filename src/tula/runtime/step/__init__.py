"""The one training step and what it stands on: the replica (model, DDP, its step), its
update, where it stands in its epoch (the walk, its data stream), evaluation, the checkpoint
snapshot, and the model registry."""
