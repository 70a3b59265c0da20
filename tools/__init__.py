"""Harnesses that live beside the package, never inside it: the local Slurm cluster the tests
start (slurm_local/: installs packages, runs daemons), the layouts diagram (layouts_diagram.py),
and the docs' renderer (gen_docs.py) with the numbers it quotes (docs_numbers/).
Run from the repository root: ``python -m tools.slurm_local up ROOT``."""
