"""Measuring a host into a hardware profile (``tspbench calibrate``): the probes of its GEMM,
attention, memory and collective rates (probes.py), each traced op of one profiled step timed
(opcosts.py, with the profiler's event tree read in profiled.py and the per-op clock in
opclock.py), the figures a whole step fits (step_figures.py), host launch costs (launches.py),
and the run that writes the profile (profile.py).

A layer of its own, above measure (it runs real steps) and below sweep; only the CLI and the
checks (gpu-check calibrates the node it checks) import it."""
