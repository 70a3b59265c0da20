"""The one model every strategy shares: a Llama-style dense decoder.

Shape legend (activation layout is batch-first everywhere):

    B   micro-batch (sequences per model replica)
    S   sequence length held by this rank (the whole sequence on one device)
    h   hidden size                     d   head dim = h / n_heads
    n   query heads held by this rank   m   key/value heads held by this rank (GQA: m <= n)
    f   gated-MLP width held by this rank (F * h on one device)
    V   vocabulary rows held by this rank

    residual stream, norms       x       [B, S, h]
    attention heads              q       [B, n, S, d]     k, v  [B, m, S_k, d]
    MLP inner                    h1, h3  [B, S, f]
    logits                               [B, S, V]
    rotary tables (cos, sin)             [S, d]

Strategies never edit this file: they shard weights (heads are reshaped with
``view(B, S, -1, d)``, so a module with fewer heads just works), and swap the hook points below.

    Attention.enter / MLP.enter     applied to the block input     (TP: copy/gather to the group)
    Attention.exit  / MLP.exit      applied to the block output    (TP: all-reduce/reduce-scatter)
    Attention.core                  (q, k, v) -> o                 (SP: K/V gathered over sequence)
    Attention.cached_core           (q, k, v, cache, step) -> o    a decode step against the KV cache
                                                                   (SP: queries gathered, partials merged)
    Transformer.embed / .head       token -> x, x -> logits/loss   (TP, TSP: vocabulary sharded)

Decode (tspbench.model.cache): ``prefill`` writes every layer's context K/V into a KVCache and
returns the logits of the last local position; ``decode_step`` runs one new token per slot
[b, 1] at its position, each attention appending its K/V and attending through ``cached_core``.

Nothing here imports torch.distributed. The configuration (ModelConfig, presets) lives in
tspbench.core.spec; the operators in tspbench.model.layers.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from tspbench.core.names import RECOMPUTE_MODES
from tspbench.core.spec import ModelConfig
from tspbench.model.cache import KVCache, LayerCache, cached_attention
from tspbench.model.layers import (
    apply_rope,
    causal_attention,
    identity,
    rms_norm,
    rope_tables,
    swiglu,
    upcast,
)
from tspbench.model.recompute import checkpoint_ops

# ----------------------------------------------------------------------------- initialisation


def fake_mode_active() -> bool:
    """Whether a FakeTensorMode is active: tensors have shapes, dtypes and devices, no values."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


def init_std(name: str, config: ModelConfig) -> float:
    """GPT-2 style: N(0, 0.02), residual-output projections scaled by 1/sqrt(2L); norms are ones."""
    if name.endswith(("wo.weight", "w2.weight")):
        return 0.02 / math.sqrt(2 * config.n_layers)
    return 0.02


def reference_parameter(
    config: ModelConfig,
    name: str,
    shape: tuple[int, ...],
    seed: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The full, unsharded value of parameter ``name``: drawn from its own generator.

    Each parameter has a generator seeded by (seed, name), so its value never depends on the
    layout, on the other parameters, or on the order they are built in. A strategy builds its
    shard by drawing the full tensor once and slicing it. Under fake tensors nothing is drawn.
    """
    if "norm" in name:
        return torch.ones(shape, device=device, dtype=dtype)
    if fake_mode_active():  # shapes only: fake tensors have no values to draw (nor CUDA generators)
        return torch.empty(shape, device=device, dtype=dtype)
    gen = torch.Generator(device=device).manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    full = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    return full.mul_(init_std(name, config)).to(dtype)


# ----------------------------------------------------------------------------- modules


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def _linear(d_in: int, d_out: int) -> nn.Linear:
    return nn.Linear(d_in, d_out, bias=False)


class Attention(nn.Module):
    """Multi-head (or grouped-query) attention with rotary embeddings. Hooks: enter, core,
    cached_core, exit. With a ``cache``: the prefill (``step`` None) writes the context K/V and
    runs ``core``; a decode step runs ``cached_core``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.wq = _linear(config.hidden, config.n_heads * config.head_dim)
        self.wk = _linear(config.hidden, config.kv_hidden)
        self.wv = _linear(config.hidden, config.kv_hidden)
        self.wo = _linear(config.n_heads * config.head_dim, config.hidden)
        self.enter: Callable[[Tensor], Tensor] = identity
        self.exit: Callable[[Tensor], Tensor] = identity
        self.core: Callable[[Tensor, Tensor, Tensor], Tensor] = causal_attention
        self.cached_core: Callable[[Tensor, Tensor, Tensor, LayerCache, int], Tensor] = cached_attention
        self.recompute_core = False

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor], cache: LayerCache | None = None, step: int | None = None
    ) -> Tensor:
        x = self.enter(x)
        B, S, _ = x.shape
        q = self.wq(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None and step is not None:
            o = self.cached_core(q, k, v, cache, step)
        elif self.recompute_core and torch.is_grad_enabled():
            o = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            if cache is not None:
                cache.write_context(k, v)
            o = self.core(q, k, v)
        o = o.transpose(1, 2).reshape(B, S, -1)
        return self.exit(self.wo(o))


class MLP(nn.Module):
    """Gated SwiGLU MLP: w2(silu(w1 x) * w3 x). Hooks: enter, exit."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w1 = _linear(config.hidden, config.ffn_hidden)
        self.w3 = _linear(config.hidden, config.ffn_hidden)
        self.w2 = _linear(config.ffn_hidden, config.hidden)
        self.enter: Callable[[Tensor], Tensor] = identity
        self.exit: Callable[[Tensor], Tensor] = identity

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        x = self.enter(x)
        return self.exit(self.w2(swiglu(self.w1(x), self.w3(x))))


class Block(nn.Module):
    """Pre-norm decoder block. ``recompute`` is one of RECOMPUTE_MODES."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden, config.norm_eps)
        self.attention: nn.Module = Attention(config)
        self.mlp_norm = RMSNorm(config.hidden, config.norm_eps)
        self.mlp: nn.Module = MLP(config)
        self.recompute = "none"

    def set_recompute(self, mode: str) -> None:
        if mode not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {mode!r}")
        self.recompute = mode
        if isinstance(self.attention, Attention):
            self.attention.recompute_core = mode == "selective"

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor], cache: LayerCache | None = None, step: int | None = None
    ) -> Tensor:
        if cache is not None:  # decode runs without autograd
            x = x + self.attention(self.attention_norm(x), rope, cache, step)
            return x + self.mlp(self.mlp_norm(x), rope)
        if self.recompute == "full" and torch.is_grad_enabled():
            return checkpoint(self._forward, x, rope, use_reentrant=False)
        if self.recompute == "op" and torch.is_grad_enabled():
            return checkpoint_ops(self._forward, x, rope)
        return self._forward(x, rope)

    def _forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.mlp(self.mlp_norm(x), rope)


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden))

    def forward(self, tokens: Tensor) -> Tensor:
        return F.embedding(tokens, self.weight)


class LMHead(nn.Module):
    """Output projection and the summed token cross-entropy."""

    def __init__(self, hidden: int, vocab_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden))

    def logits(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)

    def loss(self, x: Tensor, targets: Tensor) -> Tensor:
        logits = self.logits(x)
        loss = F.cross_entropy(upcast(logits).flatten(0, 1), targets.flatten(), reduction="sum")
        return loss.to(x.dtype)


class Transformer(nn.Module):
    """Decoder-only transformer; ``seed`` draws every weight layout-independently (reference_parameter)."""

    def __init__(self, config: ModelConfig, seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        self.embed: nn.Module = Embedding(config.vocab_size, config.hidden)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.hidden, config.norm_eps)
        self.head: nn.Module = LMHead(config.hidden, config.vocab_size)
        if seed is not None and self.embed.weight.device.type != "meta":
            self.init_weights(seed)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        for name, p in self.named_parameters():
            p.copy_(reference_parameter(self.config, name, tuple(p.shape), seed, p.device, p.dtype))

    def set_recompute(self, mode: str) -> None:
        for layer in self.layers:
            layer.set_recompute(mode)

    def hidden_states(self, tokens: Tensor, positions: Tensor | None = None) -> Tensor:
        """Final-norm output x [B, S, h] for tokens [B, S] at ``positions`` [S] (default 0..S-1)."""
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens)
        rope = rope_tables(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        for layer in self.layers:
            x = layer(x, rope)
        return self.norm(x)

    def forward(self, tokens: Tensor, positions: Tensor | None = None) -> Tensor:
        """Logits [B, S, V]."""
        return self.head.logits(self.hidden_states(tokens, positions))

    def prefill(self, tokens: Tensor, positions: Tensor, cache: KVCache) -> Tensor:
        """Context tokens [B, S_loc] at ``positions`` [S_loc] into ``cache``; returns the logits
        [B, V_loc] of the last local position (position S-1 where the rank holds it: the whole
        sequence, or zigzag rank 0's second chunk)."""
        x = self.embed(tokens)
        rope = rope_tables(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        for layer, layer_cache in zip(self.layers, cache.layers, strict=True):
            x = layer(x, rope, layer_cache)
        return self.head.logits(self.norm(x[:, -1:]))[:, 0]

    def decode_step(self, tokens: Tensor, positions: Tensor, cache: KVCache, step: int) -> Tensor:
        """One new token per slot, tokens [b, 1] at ``positions`` [b], against ``cache`` (decode
        step ``step``: tail position ``step``); returns logits [b, V_loc]."""
        x = self.embed(tokens)
        cos, sin = rope_tables(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        rope = (cos[:, None, None, :], sin[:, None, None, :])  # [b, 1, 1, d]: per slot, every head
        for layer, layer_cache in zip(self.layers, cache.layers, strict=True):
            x = layer(x, rope, layer_cache, step)
        return self.head.logits(self.norm(x))[:, 0]

    def loss_sum(self, tokens: Tensor, targets: Tensor, positions: Tensor | None = None) -> Tensor:
        """Sum of token cross-entropies (the caller divides by the global token count)."""
        return self.head.loss(self.hidden_states(tokens, positions), targets)
