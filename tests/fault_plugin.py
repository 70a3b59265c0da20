"""A strategy plugin that misbehaves on purpose, installed for one test into a temporary folder.

Faults must happen inside the ranks, which are other processes (forkserver children, Slurm
tasks), so a strategy registered in the test process would not reach them. This writes a tiny
*installed* distribution (a module plus a ``.dist-info`` with a ``tspbench.strategies`` entry
point, the same path third-party strategies take) and returns the environment that puts it on
``PYTHONPATH``; every process started with that environment (the CLI, its ranks, Slurm jobs)
sees these extra strategies:

    fault_raise    dp; rank 1 raises RuntimeError("injected fault on rank 1") while building
    fault_hang     dp; every rank sleeps for an hour while building (for cancel and timeout tests)
    fault_replica  tsp; after the gradient sync, ranks other than 0 add 1e-2 to their copy of
                   every (replicated) norm gradient: only rank 0's replica is right
    fault_channel  tsp; weights move on channel 0 instead of the declared channel 1 (the same
                   ranks, the same math: only the counted group label differs)
    fault_reduce   tp_sp; norm gradients are summed over tp instead of sp (a group of the same
                   size at tp 2 x sp 2), and its Placement says so, so the analytic count agrees
    fault_fsdp     fsdp; the first block is left out of ``fully_shard`` (the root's unit takes
                   its parameters): the same math, other collectives, all issued by FSDP2
    fault_nonzero  dp; sharding the batch calls ``nonzero`` (an output shape that depends on the
                   token values: no fake kernel can run it)
"""

from __future__ import annotations

import os
from pathlib import Path

MODULE = """
import time
from dataclasses import replace

from tspbench.strategies.dp import DataParallel
from tspbench.strategies.fsdp import FullyShardedDataParallel
from tspbench.strategies.tp_sp import TensorSequenceParallel
from tspbench.strategies.tsp import FoldedParallel


class RaisingDP(DataParallel):
    name = "fault_raise"

    def build(self):
        if self.mesh.rank == 1:
            raise RuntimeError("injected fault on rank 1")
        return super().build()


class HangingDP(DataParallel):
    name = "fault_hang"

    def build(self):
        time.sleep(3600)
        return super().build()


class CorruptReplicaTSP(FoldedParallel):
    name = "fault_replica"

    def sync_grads(self, model):
        super().sync_grads(model)
        if self.mesh.rank != 0:
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.grad.add_(1e-2)


class SameChannelTSP(FoldedParallel):
    name = "fault_channel"

    def group(self, *axes, channel=0):
        return super().group(*axes, channel=0)


class WrongAxisTPSP(TensorSequenceParallel):
    name = "fault_reduce"

    def placement(self, name, shape):
        placement = super().placement(name, shape)
        if "norm" not in name:
            return placement
        return replace(placement, reduce=tuple("tp" if a == "sp" else a for a in placement.reduce))


class UnshardedBlockFSDP(FullyShardedDataParallel):
    name = "fault_fsdp"

    def units(self, model):
        return super().units(model)[1:]


class NonzeroDP(DataParallel):
    name = "fault_nonzero"

    def shard_batch(self, tokens, targets):
        batch = super().shard_batch(tokens, targets)
        batch.tokens.nonzero()  # an output shape that depends on the token values
        return batch

"""

# strategy name -> its class in MODULE (installed as the module tspbench_fault_plugin)
STRATEGIES = {
    "fault_raise": "RaisingDP",
    "fault_hang": "HangingDP",
    "fault_replica": "CorruptReplicaTSP",
    "fault_channel": "SameChannelTSP",
    "fault_reduce": "WrongAxisTPSP",
    "fault_fsdp": "UnshardedBlockFSDP",
    "fault_nonzero": "NonzeroDP",
}
ENTRY_POINTS = "[tspbench.strategies]\n" + "".join(
    f"{n} = tspbench_fault_plugin:{c}\n" for n, c in STRATEGIES.items()
)


def install(folder: Path) -> dict[str, str]:
    """Write the plugin under ``folder``; returns os.environ plus PYTHONPATH pointing at it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tspbench_fault_plugin.py").write_text(MODULE)
    info = folder / "tspbench_fault_plugin-0.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tspbench-fault-plugin\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}
