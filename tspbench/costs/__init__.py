"""The analytic cost terms strategies are written in: per-rank memory (memory.py) and FLOPs
(flops.py) of one step, from sizes alone. Below the strategy plugins, so a plugin can state its
costs without importing the analytic model that asks for them (tspbench.analytic). No torch."""
