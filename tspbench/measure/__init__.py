"""Measuring a layout for real: one rank's step (runner.py), a measured point (bench.py), the
check against the single-device reference (validate.py), per-rank peak memory (tracker.py, with
the report it gives in memory_report.py and what a tensor holds in storages.py), counted FLOPs
(flop_counter.py), device calibration (calibrate.py), the environment record (env.py) and the GPU
check (gpu_check.py)."""
