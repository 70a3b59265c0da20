"""The analytic model: memory, communication, FLOPs and time of one step for any layout
(predict.py), the planner that ranks every layout of a cluster (planner.py), and the hardware
profiles it assumes (hardware.py, profiles/*.yaml); whether a measured CPU point fits this host's
memory (host_memory.py). Strategies state their own cost terms
(tspbench.costs); this package asks every registered strategy for them."""
