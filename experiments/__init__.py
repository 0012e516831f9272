"""popeval's experiments (not installed): run from the repository root as `python -m experiments.<folder>`."""
