"""The zigzag partition's reassembly: rank r holds chunks r and 2D-1-r (derived by hand here),
and zigzag_stack / zigzag_unshard move between the whole sequence and every rank's pieces the
same way with and without autograd."""

from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from tspbench.dist.zigzag import zigzag_stack, zigzag_unshard


def hand_positions(seq: int, parts: int, rank: int) -> list[int]:
    c = seq // (2 * parts)
    return [*range(rank * c, (rank + 1) * c), *range((2 * parts - 1 - rank) * c, (2 * parts - rank) * c)]


@pytest.mark.parametrize("parts", [1, 2, 4, 8])
def test_stack_gives_every_rank_its_two_chunks_and_unshard_undoes_it(parts: int) -> None:
    seq = 2 * parts * 3
    full = torch.arange(seq, dtype=torch.float64).view(1, 1, seq, 1).expand(2, 3, seq, 4).contiguous()
    stacked = zigzag_stack(full, parts, dim=2)  # [D, 2, 3, 2C, 4]
    assert stacked.shape == (parts, 2, 3, seq // parts, 4) and stacked.is_contiguous()
    for rank in range(parts):
        assert stacked[rank, 0, 0, :, 0].tolist() == hand_positions(seq, parts, rank)
    with torch.no_grad():
        assert torch.equal(zigzag_unshard(stacked, dim=2), full)
    pieces = stacked.clone().requires_grad_()
    joined = zigzag_unshard(pieces, dim=2)
    assert torch.equal(joined, full)
    joined.backward(full)  # the gradient of each piece is the sequence it came from
    assert torch.equal(pieces.grad, stacked)


class _Written(TorchDispatchMode):
    """Elements written by every op that is neither a view nor a bare allocation, summed."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view or func.overloadpacket in (torch.ops.aten.empty, torch.ops.aten.new_empty):
            return out
        self.elements += sum(t.numel() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


@pytest.mark.parametrize("parts", [2, 8])
def test_the_backward_writes_the_gathered_gradient_once_at_any_group_size(parts: int) -> None:
    """The K/V gather's backward (sequence order back into every rank's piece) is one pass over
    the gathered gradient, as its forward is: at D = 8 autograd's own backward of the cat of
    chunk views wrote 2D zero-filled tensors of the whole stacked size and summed them."""
    pieces = torch.randn(parts, 2, 3, 4, 5, requires_grad=True)  # [D, B, m, 2C, d]
    joined = zigzag_unshard(pieces, dim=2)
    grad = torch.randn_like(joined)
    with _Written() as written:
        (piece_grad,) = torch.autograd.grad(joined, pieces, grad)
    assert written.elements <= pieces.numel()
    assert torch.equal(piece_grad, zigzag_stack(grad, parts, dim=2))
