"""Worker runtime: the consume/compute/publish loop, checkpoints, hooks, logs."""
