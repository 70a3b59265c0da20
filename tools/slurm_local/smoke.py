"""A job function for smoke tests, importable so submitit can pickle it by reference."""

from __future__ import annotations

import os
import socket


def smoke_allreduce() -> tuple[int, int, float]:
    """One rank of a Slurm job: gloo init from the job's env (tspbench.sweep.slurm_job), all_reduce(rank + 1).

    Returns (rank, world_size, sum), where the sum is world_size * (world_size + 1) / 2.
    The rendezvous is at the first node by name (n1): the cluster made it resolve to 127.0.0.1
    (all fake nodes are this host), so a name that does not resolve fails here at once.
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from tspbench.sweep.slurm_job import job_environment

    denv = job_environment()
    socket.gethostbyname(os.environ["MASTER_ADDR"])  # raises if the name does not resolve
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every fake node is this host
    torch.set_num_threads(1)
    timeout = timedelta(seconds=60)
    dist.init_process_group("gloo", rank=denv.rank, world_size=denv.world_size, timeout=timeout)
    try:
        value = torch.tensor([float(denv.rank + 1)])
        dist.all_reduce(value)
    finally:
        dist.destroy_process_group()
    return denv.rank, denv.world_size, float(value.item())
