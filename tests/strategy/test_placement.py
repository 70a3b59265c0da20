"""Placement (tspbench.strategy.placement) drives a strategy's shards: a local parameter is its
pieces' slices of the reference weights, concatenated along dim 0, the slice this rank's
coordinate on the placement's axis. Checked on a planning mesh (rank 0's coordinates, no
process groups) against the reference weights sliced here by hand."""

from __future__ import annotations

import pytest
import torch

from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.dist.mesh import Mesh
from tspbench.model.transformer import Transformer
from tspbench.strategy import Piece, Placement, Strategy, reference_shape

TINY = ModelConfig.preset("tiny")  # h 64, 4 heads, ffn 256, vocabulary 512
WQ, W1, W3 = "layers.0.attention.wq.weight", "layers.0.mlp.w1.weight", "layers.0.mlp.w3.weight"


class Sharded(Strategy):
    """A bare strategy over a tp axis of 2: enough to materialize placements."""

    name = "sharded_for_test"
    axes = ("tp",)


def _strategy(dtype: str = "float64") -> Sharded:
    mesh = Mesh.planning({"dp": 1, "tp": 2}, 1)  # rank 0: tp index 0 of 2
    return Sharded(Layout("sharded_for_test", tp=2), Workload(TINY, dtype=dtype), mesh, torch.device("cpu"))


def test_reference_shape_is_the_model_s_own() -> None:
    with torch.device("meta"):
        model = Transformer(TINY, seed=None)
    for name, param in model.named_parameters():
        assert reference_shape(TINY, name) == tuple(param.shape)
    assert reference_shape(TINY, W1) == (256, 64)


def test_a_placement_defaults_to_a_whole_weight_summed_nowhere() -> None:
    whole = Placement((Piece(WQ),))
    piece = whole.pieces[0]
    assert (whole.axis, whole.reduce, piece.dim, piece.transpose) == (None, (), None, False)
    s = _strategy()
    assert s.local_shape(whole) == (64, 64)
    assert torch.equal(s.materialize(whole), s.reference(WQ))


@pytest.mark.parametrize("dim", [0, 1])
def test_a_piece_is_this_rank_s_chunk_along_its_dim(dim: int) -> None:
    s = _strategy()
    placement = Placement((Piece(W1, dim=dim),), axis="tp")
    local = s.materialize(placement)
    assert torch.equal(local, s.reference(W1).chunk(2, dim=dim)[0])
    assert tuple(local.shape) == s.local_shape(placement) == ((128, 64) if dim == 0 else (256, 32))


def test_packed_pieces_concatenate_along_dim_0_and_a_transposed_one_is_stored_transposed() -> None:
    s = _strategy()
    w1, w3 = (s.reference(n).chunk(2, dim=0)[0] for n in (W1, W3))
    packed = Placement((Piece(W1, dim=0), Piece(W3, dim=0)), axis="tp")
    assert torch.equal(s.materialize(packed), torch.cat([w1, w3]))
    assert s.local_shape(packed) == (256, 64)
    flipped = Placement((Piece(W1, dim=0, transpose=True),), axis="tp")
    assert torch.equal(s.materialize(flipped), w1.t())
    assert s.local_shape(flipped) == (64, 128)


def test_reference_weights_depend_on_the_seed_and_dtype_only() -> None:
    a, b = _strategy(), _strategy()
    assert torch.equal(a.reference(WQ), b.reference(WQ))  # every strategy starts from the same weights
    f32 = _strategy("float32").reference(WQ)
    assert f32.dtype == torch.float32 and torch.allclose(f32.double(), a.reference(WQ), atol=1e-7)


def test_the_default_placement_is_whole_and_summed_over_the_data_axes() -> None:
    s = _strategy()
    assert s.placement(WQ, (64, 64)) == Placement((Piece(WQ),), reduce=("dp",))
    plan = s.local_parameters()
    with torch.device("meta"):
        names = {n for n, _ in Transformer(TINY, seed=None).named_parameters()}
    assert set(plan) == names  # every parameter of the model has a placement
    assert plan[WQ] == ((64, 64), Placement((Piece(WQ),), reduce=("dp",)))
