"""What the step recorder counts of an op: the bytes it reads and writes (the timeline prices
element-wise ops by them), and what the optimizer every strategy runs moves per step."""

from __future__ import annotations

import torch
from torch import nn

from tspbench.core.trace import COMPUTE
from tspbench.measure.trace import StepRecorder
from tspbench.model.optim import MasterAdamW

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
