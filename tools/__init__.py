"""Harnesses that live beside the package, never inside it: the local Slurm cluster the tests
start (slurm_local/: installs packages, runs daemons) and the layouts diagram (layouts_diagram.py).
Run from the repository root: ``python -m tools.slurm_local up ROOT``."""
