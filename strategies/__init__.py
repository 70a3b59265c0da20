"""Built-in strategies. Importing this package registers them with tspbench.strategy.

Each module is one plugin: a Strategy subclass decorated with ``@register``. Third-party
packages add more through the ``tspbench.strategies`` entry-point group.
"""

from tspbench.strategies import dp, fsdp, fsdp_sp, sp, tp, tp_sp, tsp  # noqa: F401 - imported to register
