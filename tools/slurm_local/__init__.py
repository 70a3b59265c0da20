"""A real Slurm cluster on one host, for tests, CI and hand-testing the Slurm launch path.

Why a real cluster: submitit's ``LocalExecutor`` and ``DebugExecutor`` never run ``sbatch`` or
``srun``, so bugs in how jobs are submitted, spread over nodes and wired into ``torch.distributed``
only show on a cluster. ``LocalSlurmCluster`` runs munged, (optionally) MariaDB + slurmdbd,
slurmctld and one ``slurmd -N nX`` per fake node, all as root, with every config, socket, pid file,
log and state under one folder, and no systemd or cgroups. Clients find it through ``SLURM_CONF``::

    with LocalSlurmCluster(Path("/tmp/slurm")) as cluster:
        os.environ.update(cluster.env)
        ...  # sbatch / srun / submitit

By hand, from the repository root: ``python -m tools.slurm_local up|status|down ROOT``.

Name resolution: a job's ranks meet at its first node by name (submitit's MASTER_ADDR), and the
fake node names (n1, n2, ...) exist nowhere else, so ``start`` adds them to /etc/hosts as
127.0.0.1 (one line tagged with the cluster's root, replaced on a restart) and ``stop`` removes
that line. tspbench's jobs never guess an address for a name that does not resolve: on a real
cluster that would turn a DNS fault into ranks waiting for each other forever.
"""

# Modules: cluster.py (LocalSlurmCluster: start, stop, status), config.py (slurm.conf and
# slurmdbd.conf), install.py (ensure_installed: apt-get), host.py (ports, /etc/hosts),
# processes.py (finding and stopping daemons), smoke.py (a job for smoke tests), __main__.py (the
# CLI, whose --help is the docstring above).

from tools.slurm_local.cluster import LocalSlurmCluster, SlurmClusterError
from tools.slurm_local.install import ensure_installed

__all__ = ["LocalSlurmCluster", "SlurmClusterError", "ensure_installed"]
