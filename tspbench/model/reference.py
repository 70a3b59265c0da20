"""The single-device reference every strategy is checked against, and the synthetic data.

The reference is the plain model on one device: forward, summed cross-entropy divided by the
token count, backward, AdamW. Strategies start from the same weights (drawn per parameter from
the seed) and see the same tokens, so losses, logits, gradients and updated weights compare
exactly up to floating-point summation order.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from tspbench.core.spec import ModelConfig, Workload
from tspbench.model.cache import KVCache
from tspbench.model.optim import build_optimizer, torch_dtype
from tspbench.model.transformer import Transformer


@contextmanager
def single_threaded() -> Iterator[None]:
    """One intra-op thread: deterministic summation order, and on a busy 2-core host ~15x faster
    than two spinning OpenMP threads for these small CPU models."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def make_batch(
    config: ModelConfig, n_seqs: int, seq_len: int, seed: int, device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor]:
    """Synthetic tokens and next-token targets [n_seqs, seq_len], the same on every rank."""
    gen = torch.Generator().manual_seed(seed + 1)
    data = torch.randint(config.vocab_size, (n_seqs, seq_len + 1), generator=gen)
    return data[:, :-1].to(device), data[:, 1:].to(device)


class Reference:
    """One device, the whole model, the global batch (``n_seqs`` = dp x micro-batch)."""

    def __init__(self, workload: Workload, n_seqs: int, device: torch.device | str = "cpu") -> None:
        self.workload = workload
        self.model = Transformer(workload.model, seed=None).to(
            device=device, dtype=torch_dtype(workload.dtype)
        )
        self.model.init_weights(workload.seed)
        self.model.set_recompute(workload.recompute)
        self.optimizer = build_optimizer(self.model.parameters(), torch_dtype(workload.dtype))
        self.tokens, self.targets = make_batch(
            workload.model, n_seqs, workload.seq_len, workload.seed, device
        )

    def train_step(self) -> Tensor:
        """Forward, loss, backward, AdamW step; returns the mean loss."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.model.loss_sum(self.tokens, self.targets) / self.tokens.numel()
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    @torch.no_grad()
    def logits(self) -> Tensor:
        """Prefill forward: logits [n_seqs, S, V]."""
        return self.model(self.tokens)

    @torch.no_grad()
    def decode(self, steps: int | None = None) -> tuple[Tensor, Tensor]:
        """Greedy decode: the prefill of the S context tokens into a KV cache, then ``steps``
        (default the workload's decode_tokens) steps, step k feeding token k at position S + k.

        Returns tokens [steps + 1, n_seqs] (token 0 from the prefill's logits at position S-1,
        token k+1 from step k; greedy argmax, ties to the lowest index) and the logits they came
        from [steps + 1, n_seqs, V].
        """
        steps = self.workload.decode_tokens if steps is None else steps
        cfg, (n_seqs, seq_len) = self.workload.model, self.tokens.shape
        device, dtype = self.tokens.device, next(self.model.parameters()).dtype
        cache = KVCache.allocate(
            cfg.n_layers, n_seqs, cfg.n_kv_heads, seq_len, steps, cfg.head_dim, dtype, device
        )
        logits = [self.model.prefill(self.tokens, torch.arange(seq_len, device=device), cache)]
        tokens = [logits[0].argmax(dim=-1)]
        for step in range(steps):
            positions = torch.full((n_seqs,), seq_len + step, device=device)
            logits.append(self.model.decode_step(tokens[-1][:, None], positions, cache, step))
            tokens.append(logits[-1].argmax(dim=-1))
        return torch.stack(tokens), torch.stack(logits)

    def tensors(self, grads: bool = False) -> dict[str, Tensor]:
        return {n: (p.grad if grads else p).detach().clone() for n, p in self.model.named_parameters()}
