"""Sweeps: experiment files (experiment.py) expanded into points (points.py), run by an executor
(run.py; local.py here, slurm.py + slurm_job.py + cluster.py on Slurm) into the results store
(store.py), reporting progress to the tspbench.core.progress.Progress the CLI hands down."""
