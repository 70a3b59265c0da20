"""Decode steps replayed as captured CUDA graphs: the launch and Python cost of a step's ~1,000
small kernels paid once, at capture, instead of every token.

A step's shapes depend on its index (it attends to the S + step + 1 cached positions), so each
step index gets its own graph, captured the first time it runs and replayed on every later run;
the graphs share one memory pool. Their static inputs are the KV cache (allocated once and kept
for every graphed run, so the addresses the graphs captured stay valid) and one [b, 1] token
buffer the previous step's tokens are copied into. Replaying runs the same kernels on the same
inputs as eager execution, so it produces the same tokens (gpu-check's decode/tpot compares).

The graphs replay what was captured and nothing else: the collectives counted and the memory
tracked come from eager runs (tspbench.measure.decode_bench runs its tracked run eagerly).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tspbench.model.cache import KVCache


class DecodeGraphs:
    """Per-step CUDA graphs of ``strategy.decode_step`` over one persistent cache (module doc)."""

    def __init__(self, strategy, model: nn.Module) -> None:
        self.strategy, self.model = strategy, model
        self.cache: KVCache = strategy.allocate_cache()
        self.tokens = torch.zeros(strategy.decode_slots, 1, dtype=torch.long, device=strategy.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, Tensor] = {}
        self.pool = None

    def step(self, tokens: Tensor, step: int) -> Tensor:
        """Logits [b, V] of decode step ``step`` for ``tokens`` [b, 1] (captured on first use)."""
        self.tokens.copy_(tokens)
        if step not in self.graphs:
            self._capture(step)
        self.graphs[step].replay()
        return self.logits[step]

    def _capture(self, step: int) -> None:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.logits[step] = self.strategy.decode_step(self.model, self.tokens, self.cache, step)
        self.pool = self.pool or graph.pool()
        self.graphs[step] = graph
