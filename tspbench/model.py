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
    Transformer.embed / .head       token -> x, x -> logits/loss   (TP, TSP: vocabulary sharded)

Nothing here imports torch.distributed.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of the decoder. ``ffn_hidden`` is the gated-MLP width (the paper: 4 h)."""

    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    vocab_size: int = 32000
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    name: str = "custom"

    def __post_init__(self) -> None:
        if self.hidden % self.n_heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    @property
    def kv_groups(self) -> int:
        """g = query heads per key/value head (1 = plain multi-head attention)."""
        return self.n_heads // self.n_kv_heads

    @property
    def kv_hidden(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def params_per_layer(self) -> int:
        """Weights of one block, norms included: (2 + 2/g + 3F) h^2 + 2h."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_hidden + 3 * h * self.ffn_hidden + 2 * h

    @property
    def n_params(self) -> int:
        return self.n_layers * self.params_per_layer + 2 * self.vocab_size * self.hidden + self.hidden

    @classmethod
    def preset(cls, name: str, **overrides: object) -> ModelConfig:
        """A named configuration; ``overrides`` replace single fields (e.g. ``vocab_size``)."""
        if name not in PRESETS:
            raise KeyError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
        return replace(PRESETS[name], **overrides)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


PRESETS: dict[str, ModelConfig] = {
    # The paper's "7B": 16 h^2 L = 8.59e9 block weights (gated MLP of width 4h, no GQA).
    "7b": ModelConfig(4096, 32, 32, 32, 4 * 4096, vocab_size=32000, name="7b"),
    "1b": ModelConfig(2048, 16, 16, 16, 4 * 2048, vocab_size=32000, name="1b"),
    # CPU presets: small enough for multi-rank float64 checks in seconds.
    "tiny": ModelConfig(64, 2, 4, 4, 256, vocab_size=512, name="tiny"),
    "tiny-gqa": ModelConfig(64, 2, 4, 2, 256, vocab_size=512, name="tiny-gqa"),
    "small": ModelConfig(256, 4, 8, 8, 1024, vocab_size=4096, name="small"),
}


# ----------------------------------------------------------------------------- initialisation


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
    shard by drawing the full tensor once and slicing it.
    """
    if "norm" in name:
        return torch.ones(shape, device=device, dtype=dtype)
    gen = torch.Generator(device=device).manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    full = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    return full.mul_(init_std(name, config)).to(dtype)


# ----------------------------------------------------------------------------- fused operators


class _RMSNorm(torch.autograd.Function):
    """y = x * rsqrt(mean(x^2) + eps) * w. Saves x and rstd [B, S, 1], like a fused kernel."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        rstd = torch.rsqrt(upcast(x).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return (upcast(x) * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, rstd, weight = ctx.saved_tensors
        xhat = upcast(x) * rstd
        dxhat = upcast(dy * weight)
        dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
        dw = (upcast(dy) * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


class _SwiGLU(torch.autograd.Function):
    """a = silu(h1) * h3. Saves h1 and h3 only (a fused gated activation)."""

    @staticmethod
    def forward(ctx, h1: Tensor, h3: Tensor) -> Tensor:
        ctx.save_for_backward(h1, h3)
        return F.silu(h1) * h3

    @staticmethod
    def backward(ctx, da: Tensor):
        h1, h3 = ctx.saved_tensors
        return swiglu_backward(h1, h3, da)


def upcast(x: Tensor) -> Tensor:
    """float32 for half-precision tensors (norm statistics, softmax, loss); unchanged otherwise."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def swiglu_backward(h1: Tensor, h3: Tensor, da: Tensor) -> tuple[Tensor, Tensor]:
    """Gradients of silu(h1) * h3 with respect to h1 and h3."""
    sig = torch.sigmoid(h1)
    silu = h1 * sig
    return da * h3 * sig * (1 + h1 * (1 - sig)), da * silu


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return _RMSNorm.apply(x, weight, eps)


def swiglu(h1: Tensor, h3: Tensor) -> Tensor:
    return _SwiGLU.apply(h1, h3)


def rope_tables(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos, sin [S, d] for the given (true, possibly non-contiguous) token positions."""
    inv_freq = theta ** -(
        torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float64) / head_dim
    )
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x [B, n, S, d] by its positions (half-split layout).

    The rotation is orthogonal: its transpose (the backward) is apply_rope(g, cos, -sin).
    """
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal attention with bottom-right alignment: o [B, n, Sq, d] from q [B, n, Sq, d], k, v [B, m, Sk, d].

    A query chunk may sit at the end of a longer key prefix (Sq <= Sk): query i sees keys
    j <= i + Sk - Sq. Sequence-parallel strategies rely on this. Flash kernels on GPU (bf16,
    fp16); on CPU two flash calls merged by log-sum-exp, so no O(Sq Sk) mask is ever built.
    """
    sq, sk = q.shape[-2], k.shape[-2]
    gqa = q.shape[1] != k.shape[1]
    if sq == sk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if sq > sk:
        raise ValueError(f"query length {sq} exceeds key length {sk}")
    if gqa:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256:
        # The flash kernel aligns its causal mask bottom-right when Sq != Sk.
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0]
    if q.device.type == "cpu" and _CPU_FLASH is not None and q.shape[-2] < k.shape[-2]:
        return _LowerRightCausalCPU.apply(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=lower_right_mask(sq, sk, q))


def lower_right_mask(sq: int, sk: int, like: Tensor) -> Tensor:
    """Additive [Sq, Sk] mask: query i sees keys j <= i + Sk - Sq."""
    keep = torch.ones(sq, sk, dtype=torch.bool, device=like.device).tril(sk - sq)
    return torch.zeros(sq, sk, dtype=like.dtype, device=like.device).masked_fill_(~keep, float("-inf"))


_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_CPU_FLASH_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


class _LowerRightCausalCPU(torch.autograd.Function):
    """Bottom-right causal attention on CPU with no [Sq, Sk] mask at all.

    The key prefix before the query chunk is fully visible and the last Sq keys form a square
    causal block: two CPU flash calls merged by their log-sum-exps. Saves q, k, v, o and the
    merged log-sum-exp, as flash kernels do on GPU. Backward calls the flash backward of each
    part with the merged o and lse, whose softmax normaliser is the global one (the
    ring-attention identity), and sums dq.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        split = k.shape[-2] - q.shape[-2]
        o1, lse1 = _CPU_FLASH(q, k[:, :, :split], v[:, :, :split], 0.0, False)
        o2, lse2 = _CPU_FLASH(q, k[:, :, split:], v[:, :, split:], 0.0, True)
        lse = torch.logaddexp(lse1, lse2)
        w1, w2 = (lse1 - lse).exp().unsqueeze(-1), (lse2 - lse).exp().unsqueeze(-1)
        out = (upcast(o1) * w1 + upcast(o2) * w2).to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        split = k.shape[-2] - q.shape[-2]
        dout = dout.contiguous()
        dq1, dk1, dv1 = _CPU_FLASH_BACKWARD(dout, q, k[:, :, :split], v[:, :, :split], out, lse, 0.0, False)
        dq2, dk2, dv2 = _CPU_FLASH_BACKWARD(dout, q, k[:, :, split:], v[:, :, split:], out, lse, 0.0, True)
        return dq1 + dq2, torch.cat([dk1, dk2], dim=2), torch.cat([dv1, dv2], dim=2)


def identity(x: Tensor) -> Tensor:
    return x


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
    """Multi-head (or grouped-query) attention with rotary embeddings. Hooks: enter, core, exit."""

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
        self.recompute_core = False

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        x = self.enter(x)
        B, S, _ = x.shape
        q = self.wq(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.recompute_core and torch.is_grad_enabled():
            o = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
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

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        if self.recompute == "full" and torch.is_grad_enabled():
            return checkpoint(self._forward, x, rope, use_reentrant=False)
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

    def loss_sum(self, tokens: Tensor, targets: Tensor, positions: Tensor | None = None) -> Tensor:
        """Sum of token cross-entropies (the caller divides by the global token count)."""
        return self.head.loss(self.hidden_states(tokens, positions), targets)
