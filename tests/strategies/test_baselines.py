"""What the torch-wrapper baselines promise beyond the contract tests (tests/strategies/test_numerics.py):
DDP's all-reduces start during backward, FSDP's padded shards stay exact and hold 1/D of the
state, and bad input is one line, exit 2, before any rank starts."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.fsdp as torch_fsdp

from tspbench.cli.main import main
from tspbench.core.spec import Layout, ModelConfig, Workload
from tspbench.dist import comm
from tspbench.dist.launch import launch
from tspbench.measure.runner import RankRun
from tspbench.measure.validate import validate

pytestmark = pytest.mark.slow  # multi-rank runs, sweeps or Slurm: make test, not make check

# Sizes no degree divides: FSDP pads every shard (509 / 4 -> 128 rows, 130 -> 33, ...).
ODD = ModelConfig(48, 2, 4, 2, 130, vocab_size=509, name="odd")


def _ddp_order() -> tuple[int, int]:
    """(bucket all-reduces already issued when the embedding's gradient arrives - the last one
    backward produces -, all issued in the step)."""
    run = RankRun(Layout("dp", dp=2), Workload(ModelConfig.preset("small"), 1, 64, dtype="float32"))
    seen = []
    with comm.counting() as log:
        embed = run.model.embed.weight
        handle = embed.register_post_accumulate_grad_hook(lambda p: seen.append(len(log.records)))
        run.step()
        handle.remove()
    backward = [r for r in log.records if r.op == "all_reduce" and r.phase == "backward"]
    return seen[0], len(backward)


def test_ddp_reduces_buckets_while_backward_runs() -> None:
    for before_embedding, total in launch(_ddp_order, 2):
        assert total == 2  # small, float32: the head's 4 MiB (>= 1 MiB), then the other 20 MiB
        assert 1 <= before_embedding < total  # the head's bucket went out before backward ended


def _state(layout: Layout, workload: Workload) -> dict[str, int]:
    run = RankRun(layout, workload)
    return run.measured_step().state


@pytest.mark.parametrize("layout", [Layout("fsdp_sp", sp=4), Layout("fsdp", fsdp=4)], ids=Layout.describe)
def test_state_per_rank_is_a_quarter_of_one_device(layout: Layout) -> None:
    workload = Workload(ODD, 1, 64, dtype="float32")
    one_device = 4 * ODD.n_params * 4  # parameters, gradients, AdamW's m and v, float32
    for state in launch(_state, 4, layout, workload):
        per_rank = state["parameters"] + state["gradients"] + state["optimizer"]
        assert abs(per_rank / (one_device / 4) - 1) <= 0.02, (per_rank, one_device / 4)


def test_padded_shards_are_exact() -> None:
    result = validate(Layout("fsdp", fsdp=4), Workload(ODD, 1, 64, dtype="float64"), ("train",))
    assert result["passed"], (result["max_rel_err"], result["comm_counted"], result["comm_analytic"])


def _exit(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["validate", "--strategy", "fsdp_sp", "--sp", "4", "--seq-len", "100"], "divisible by 2 x sp = 8"),
        (["bench", "--strategy", "fsdp", "--fsdp", "1024", "--device", "cuda"], "need 1024 GPUs"),
        (["validate", "--strategy", "fsdp", "--fsdp", "2", "--tp", "2"], "tp=2 must be 1"),
    ],
)
def test_bad_layouts_exit_2_before_any_rank(argv: list[str], problem: str, capsys) -> None:
    code, err = _exit(argv, capsys)
    assert code == 2 and problem in err and len(err.strip().splitlines()) == 1, err


def test_torch_without_fsdp2_exits_2(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delattr(torch_fsdp, "fully_shard")
    code, err = _exit(["validate", "--strategy", "fsdp_sp", "--sp", "2"], capsys)
    assert code == 2 and "torch.distributed.fsdp.fully_shard" in err and torch.__version__ in err, err
