"""The one model every strategy shares (transformer.py), its operators (layers.py), the dtype
policy and optimizer (optim.py), and the single-device reference (reference.py).

Imports only tspbench.core and torch (never torch.distributed).
"""
