"""Running or executing a layout's step: one rank's step (runner.py), a measured point
(bench.py), the check against the single-device reference (validate.py), per-rank peak memory
(tracker.py, with the report it gives in memory_report.py and what a tensor holds in
storages.py), counted FLOPs (flop_counter.py), the step recorder (trace.py), the fake world
(fake.py, fake_cuda.py), decode (decode_bench.py, decode_graphs.py), energy (energy.py) and the
environment record (env.py). Calibrating a host is tspbench.calibrate; the GPU check is
tspbench.checks.gpu_check."""
