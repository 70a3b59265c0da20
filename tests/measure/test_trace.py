"""What the step recorder counts of an op: the bytes it reads and writes (the timeline prices
element-wise ops by them), and what the optimizer every strategy runs moves per step."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from tspbench.core.trace import COMPUTE
from tspbench.measure.simulated_gpu import simulated_gpu
from tspbench.measure.trace import StepRecorder
from tspbench.model.optim import MasterAdamW, build_optimizer, step_bytes_per_element

N = 1000  # elements per tensor


def recorded(fn) -> dict[str, int]:
    """Bytes by op name of what ``fn`` runs."""
    with StepRecorder(0) as rec:
        fn()
    trace = rec.trace()
    ev = trace.events[trace.events["kind"] == COMPUTE]
    out: dict[str, int] = {}
    for name, nbytes in zip(ev["name"], ev["nbytes"], strict=True):
        out[trace.names[name]] = out.get(trace.names[name], 0) + int(nbytes)
    return out


def test_an_op_counts_what_it_reads_and_what_it_writes() -> None:
    a, b = torch.ones(N), torch.ones(N)  # float32: 4 B an element
    assert recorded(lambda: a + b) == {"add": 3 * 4 * N}  # reads a, b; writes the sum
    assert recorded(lambda: a.mul_(2.0)) == {"mul_": 2 * 4 * N}  # reads a, writes a


def test_a_fill_writes_its_output_and_reads_nothing() -> None:
    a = torch.ones(N)
    assert recorded(lambda: torch.zeros_like(a)) == {"zeros_like": 4 * N}
    assert recorded(lambda: a.new_zeros(2 * N)) == {"new_zeros": 2 * 4 * N}


def test_an_op_that_writes_its_arguments_without_returning_them_counts_the_writes() -> None:
    xs = [torch.ones(N), torch.ones(N)]
    ys = [torch.ones(N), torch.ones(N)]
    # _foreach_copy_ returns nothing: it reads ys and writes xs, 2 x 2 x 4 B an element
    assert recorded(lambda: torch._foreach_copy_(xs, ys)) == {"_foreach_copy_": 2 * 2 * 4 * N}


def test_master_adamw_moves_96_bytes_a_bfloat16_parameter_once_its_state_exists() -> None:
    """Per element, with float32 master, m, v and a bfloat16 parameter and gradient: the
    gradient cast (2 read + 4 written), lerp_ m (4 + 4, 4), mul_ v (4, 4), addcmul_ v (4 + 4 + 4,
    4), decay mul_ (4, 4), sqrt (4, 4), div (4, 4), add_ (4, 4), addcdiv_ (4 + 4 + 4, 4), copy to
    the parameter (4, 2): 96 B. No zeroed state after the first step."""
    p = nn.Parameter(torch.ones(N, dtype=torch.bfloat16))
    opt = MasterAdamW([p])

    def step() -> None:
        p.grad = torch.ones_like(p)
        opt.step()

    step()  # creates the state
    p.grad = torch.ones_like(p)
    counted = recorded(opt.step)
    assert "zeros_like" not in counted and "zero_" not in counted
    assert sum(counted.values()) == 96 * N


@pytest.mark.parametrize(
    ("dtype", "device"),
    [(torch.bfloat16, "cpu"), (torch.float32, "cpu"), (torch.float64, "cpu"), (torch.float32, "cuda")],
)
def test_the_time_model_charges_the_optimizer_what_its_step_moves(dtype: torch.dtype, device: str) -> None:
    """Per element, the bytes the time model prices equal what the implementation build_optimizer
    picks (fused on a simulated GPU, per parameter on the CPU) was recorded moving: the step of a
    2N-element parameter less that of an N-element one (which leaves out the step counter)."""

    def step_bytes(numel: int) -> int:
        with FakeTensorMode(), simulated_gpu(device):
            p = nn.Parameter(torch.ones(numel, dtype=dtype, device=device))
            opt = build_optimizer([p], dtype)
            p.grad = torch.ones_like(p)
            opt.step()
            p.grad = torch.ones_like(p)
            return sum(recorded(opt.step).values())

    size = torch.tensor([], dtype=dtype).element_size()
    assert step_bytes(2 * N) - step_bytes(N) == N * step_bytes_per_element(size, device == "cuda")


def test_fsdp2s_copy_in_counts_the_shards_it_copies_not_the_whole_gather_buffer() -> None:
    """all_gather_copy_in copies the rank's shards into its slot of the all-gather buffer (and
    returns the slot and the buffer): at world 4 it reads and writes the shards, a quarter of
    the buffer, once each."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives  # noqa: F401 (registers the op)

    shards = [torch.ones(N, dtype=torch.bfloat16), torch.ones(N, dtype=torch.bfloat16)]
    buffer = torch.empty(4 * 2 * N, dtype=torch.bfloat16)
    copy_in = torch.ops.fsdp.all_gather_copy_in
    assert recorded(lambda: copy_in(shards, buffer, [N, N], 2 * N, 1)) == {
        "all_gather_copy_in": 2 * 2 * 2 * N
    }
