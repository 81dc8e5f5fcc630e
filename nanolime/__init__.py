"""nanoLIMe's plumbing: configuration and errors, checkpoints, datasets, variant names, sweep reports."""
