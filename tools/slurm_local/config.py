"""The cluster's config files (slurm.conf, slurmdbd.conf): every path under its root, every port its own."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Protocol


class ClusterSettings(Protocol):
    """What the config files are written from: LocalSlurmCluster has every one of these.

    A protocol, so that this module needs nothing from cluster.py, which imports
    ``write_configs`` from here: the two modules do not import each other.
    """

    root: Path
    nodes: int
    cpus_per_node: int
    accounting: bool
    ports: dict[str, int]  # slurmctld, slurmdbd, mariadb and each node name -> its port

    @property
    def partition(self) -> str: ...
    @property
    def cluster_name(self) -> str: ...
    @property
    def conf_path(self) -> Path: ...
    @property
    def munge_socket(self) -> Path: ...
    @property
    def node_names(self) -> list[str]: ...


def write_configs(c: ClusterSettings) -> None:
    """plugstack.conf, slurm.conf, slurmdbd.conf (with accounting) and ports.json, for the ports
    the cluster has just chosen."""
    (c.root / "etc" / "plugstack.conf").write_text("")  # no site SPANK plugins
    c.conf_path.write_text(slurm_conf(c))
    if c.accounting:
        dbd = c.root / "etc" / "slurmdbd.conf"
        dbd.write_text(slurmdbd_conf(c))
        dbd.chmod(0o600)  # slurmdbd refuses a config others can read (it holds a password)
    (c.root / "ports.json").write_text(json.dumps(c.ports, indent=1))


def slurm_conf(c: ClusterSettings) -> str:
    """slurm.conf: munge auth, no cgroups, CPUs as the consumable, every node on 127.0.0.1."""
    host = socket.gethostname().split(".")[0]
    r = c.root
    mem_mb = max(1024, _total_memory_mb() // c.nodes)
    lines = [
        f"ClusterName={c.cluster_name}",
        # slurmctld only starts on a host named in SlurmctldHost; clients use the address.
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={c.ports['slurmctld']}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={c.munge_socket}",
        f"StateSaveLocation={r}/state/ctld",
        f"SlurmdSpoolDir={r}/spool/%n",
        f"SlurmctldPidFile={r}/run/slurm/slurmctld.pid",
        f"SlurmdPidFile={r}/run/slurm/slurmd-%n.pid",
        f"SlurmctldLogFile={r}/log/slurmctld.log",
        f"SlurmdLogFile={r}/log/slurmd-%n.log",
        f"PlugStackConfig={r}/etc/plugstack.conf",
        # No cgroups in containers/CI: track processes via /proc, no task binding.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        # CR_CPU: CPUs are the consumable, so several 1-CPU tasks share a node.
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/builtin",
        # Schedule batch jobs at submit time, not up to 3 s later (the default).
        "SchedulerParameters=batch_sched_delay=0",
        # Trust the CPUs= below over the 2 real cores.
        "SlurmdParameters=config_overrides",
        "MpiDefault=none",
        "MailProg=/bin/true",  # no mail on CI; Slurm logs an error if the default is missing
        "SwitchType=switch/none",
        "ReturnToService=2",
        "KillWait=2",
        "MinJobAge=10",
        "InactiveLimit=0",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=60",
        "MessageTimeout=10",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        *_accounting_lines(c),
        *_node_lines(c, host, mem_mb),
        f"PartitionName={c.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def _accounting_lines(c: ClusterSettings) -> list[str]:
    """Jobs recorded by slurmdbd with ``accounting``, else nowhere."""
    if not c.accounting:
        return ["AccountingStorageType=accounting_storage/none"]
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=127.0.0.1",
        f"AccountingStoragePort={c.ports['slurmdbd']}",
        # For the slurmdbd connection the "password" is the munge socket; AuthInfo is
        # not used there, and the default /run/munge socket does not exist.
        f"AccountingStoragePass={c.munge_socket}",
    ]


def _node_lines(c: ClusterSettings, host: str, mem_mb: int) -> list[str]:
    """One line per node, each at NodeAddr 127.0.0.1 (every node is this host)."""
    return [
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={c.ports[n]} "
        f"CPUs={c.cpus_per_node} RealMemory={mem_mb} State=UNKNOWN"
        for n in c.node_names
    ]


def slurmdbd_conf(c: ClusterSettings) -> str:
    """slurmdbd.conf: munge auth, the private MariaDB over TCP on its own port."""
    host = socket.gethostname().split(".")[0]
    r = c.root
    lines = [
        "AuthType=auth/munge",
        f"AuthInfo=socket={c.munge_socket}",
        f"DbdHost={host}",
        "DbdAddr=127.0.0.1",
        f"DbdPort={c.ports['slurmdbd']}",
        "SlurmUser=root",
        f"PidFile={r}/run/slurm/slurmdbd.pid",
        f"LogFile={r}/log/slurmdbd.log",
        "DebugLevel=info",
        "StorageType=accounting_storage/mysql",
        # TCP, because slurmdbd has no setting for a MariaDB socket path.
        "StorageHost=127.0.0.1",
        f"StoragePort={c.ports['mariadb']}",
        "StorageUser=slurm",
        "StoragePass=unused",  # MariaDB runs with --skip-grant-tables, local only
        "StorageLoc=slurm_acct_db",
    ]
    return "\n".join(lines) + "\n"


def _total_memory_mb() -> int:
    """The host's memory, split over the fake nodes as their RealMemory."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 4096
