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

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

APT_PACKAGES = ("slurm-wlm", "munge", "slurmdbd", "mariadb-server")
# Binaries the cluster runs; a missing one means the packages above are not (fully) installed.
REQUIRED_BINARIES = (
    "slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "mariadb-install-db",
    "sinfo", "squeue", "sbatch", "srun", "scancel", "sacct", "scontrol",
)  # fmt: skip
# Process names that belong to a Slurm cluster; used by tests to check that nothing is left.
PROCESS_NAMES = (
    "slurmctld", "slurmscriptd", "slurmd", "slurmdbd", "slurmstepd", "munged", "mariadbd",
)  # fmt: skip
# /usr/sbin is often not on a non-root PATH, but the daemons live there.
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"])
_UNIX_PATH_MAX = 107  # sun_path is 108 bytes including the trailing NUL
START_TIMEOUT_S = 60.0
CANCEL_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
HOSTS_FILE = Path("/etc/hosts")
_HOSTS_TAG = "# tspbench slurm_local"
# Small InnoDB files: a test database needs ~30 MB on disk instead of ~110 MB.
_MARIADB_SIZES = ("--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M")


class SlurmClusterError(RuntimeError):
    """The local cluster could not be started or stopped; the message carries log tails."""

    def __init__(self, message: str, daemon: str | None = None) -> None:
        super().__init__(message)
        self.daemon = daemon  # the daemon that failed, whose logs are shown first


def which(name: str) -> str | None:
    """Find a binary, also in the sbin folders a non-root PATH leaves out."""
    return shutil.which(name, path=_SEARCH_PATH)


def missing_binaries() -> list[str]:
    """Names of required Slurm/munge/MariaDB binaries that are not installed."""
    return [name for name in REQUIRED_BINARIES if which(name) is None]


def ensure_installed() -> str | None:
    """Install Slurm, munge, slurmdbd and MariaDB with apt if needed.

    Returns None when a cluster can be started, else a one-line reason, so a test can
    ``pytest.skip(reason)`` instead of failing on machines that cannot run Slurm.
    """
    if not sys.platform.startswith("linux"):
        return f"a local Slurm cluster needs Linux, not {sys.platform}"
    if missing_binaries():
        reason = _apt_install(APT_PACKAGES)
        if reason is not None:
            return reason
        still = missing_binaries()
        if still:
            return f"Slurm binaries still missing after apt-get install: {', '.join(still)}"
    if os.geteuid() != 0:
        return "a local Slurm cluster runs slurmd/slurmstepd as root; run the tests as root"
    return None


def _apt_install(packages: Sequence[str]) -> str | None:
    """apt-get install; only on failure refresh the package lists and retry (saves ~10 s)."""
    apt = which("apt-get")
    if apt is None:
        return "Slurm is not installed and there is no apt-get to install it"
    prefix: list[str] = []
    if os.geteuid() != 0:
        sudo = which("sudo")
        if sudo is None:
            return "Slurm is not installed and installing it needs root (no sudo)"
        prefix = [sudo, "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*prefix, apt, "install", "-y", "-q", "--no-install-recommends", *packages]
    if _quiet_run(install, env) == 0:
        return None
    if _quiet_run([*prefix, apt, "update", "-q"], env) != 0:
        return "apt-get update failed; cannot install Slurm"
    if _quiet_run(install, env) != 0:
        return f"apt-get install {' '.join(packages)} failed"
    return None


def _quiet_run(cmd: list[str], env: dict[str, str]) -> int:
    """Run a command without output; a hang (e.g. apt lock) counts as failure."""
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 1
    return done.returncode


def free_ports(count: int) -> list[int]:
    """Ports the kernel reports free right now, so clusters under other roots do not collide.

    All sockets are held open together so the ports are distinct. There is a small race until
    the daemons bind them, which is acceptable for tests.
    """
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def add_host_names(names: Sequence[str], root: Path, hosts: Path = HOSTS_FILE) -> None:
    """Make ``names`` resolve to 127.0.0.1: one line in ``hosts`` tagged with the cluster's
    root (a restart replaces it, never adds a second; clusters under other roots keep theirs)."""
    tag = f"{_HOSTS_TAG} {root}"
    line = f"127.0.0.1 {' '.join(names)} {tag}"
    _edit_hosts(hosts, lambda lines: [*(ln for ln in lines if not ln.endswith(tag)), line])


def remove_host_names(root: Path, hosts: Path = HOSTS_FILE) -> None:
    """Remove the line ``add_host_names`` wrote for ``root`` (nothing else is touched)."""
    tag = f"{_HOSTS_TAG} {root}"
    _edit_hosts(hosts, lambda lines: [ln for ln in lines if not ln.endswith(tag)])


def _edit_hosts(hosts: Path, change: Callable[[list[str]], list[str]]) -> None:
    """Rewrite ``hosts`` in place under an exclusive flock (several clusters may start at once).
    In place, not renamed over: in containers /etc/hosts is often a bind mount."""
    with hosts.open("r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        lines = f.read().splitlines()
        new = change(lines)
        if new != lines:
            f.seek(0)
            f.write("".join(f"{ln}\n" for ln in new))
            f.truncate()


def pid_alive(pid: int) -> bool:
    """True if the process runs; a zombie counts as gone (some container inits never reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def live_slurm_processes() -> list[tuple[int, str]]:
    """(pid, name) of every live Slurm/munge/MariaDB process on the host, zombies excluded."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            name = (proc / "comm").read_text().strip()
        except OSError:
            continue
        if name in PROCESS_NAMES and pid_alive(int(proc.name)):
            found.append((int(proc.name), name))
    return found


def _tail(path: Path, lines: int = 15) -> str:
    """Last lines of a log, for error messages that explain why a daemon did not come up."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"--- {path.name}: (no file)"
    return "\n".join([f"--- {path.name}:", *text[-lines:]])


def _port_open(port: int) -> bool:
    """True once a daemon accepts TCP connections on 127.0.0.1:port."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


class LocalSlurmCluster:
    """A Slurm cluster with ``nodes`` fake nodes on this host, kept entirely under ``root``.

    Nodes are ``n1..nN``, all with NodeAddr 127.0.0.1 and their own slurmd port, and their names
    resolve to 127.0.0.1 through ``hosts_file`` while the cluster is up; each advertises
    ``cpus_per_node`` CPUs whatever the real core count (``SlurmdParameters=config_overrides``),
    so multi-node, multi-task jobs fit on a 2-core machine. With ``accounting`` a private
    MariaDB + slurmdbd record jobs, so ``sacct`` (and submitit) see real job states; without
    it submitit sees every state as UNKNOWN.
    """

    partition = "local"
    cluster_name = "tspbench"

    def __init__(
        self,
        root: Path,
        nodes: int = 2,
        cpus_per_node: int = 8,
        accounting: bool = True,
        hosts_file: Path = HOSTS_FILE,
    ) -> None:
        if nodes < 1 or cpus_per_node < 1:
            raise ValueError("nodes and cpus_per_node must be >= 1")
        self.root = Path(root).absolute()
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.accounting = accounting
        self.hosts_file = hosts_file
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}

    # ---- layout -------------------------------------------------------------------------
    @property
    def conf_path(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "run" / "munge.socket.2"

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    @property
    def env(self) -> dict[str, str]:
        """Variables a client needs; ``os.environ.update(cluster.env)`` points sbatch/sacct/
        submitit at this cluster (the munge socket is found through slurm.conf's AuthInfo)."""
        return {"SLURM_CONF": str(self.conf_path)}

    def _pid_file(self, name: str) -> Path:
        return self.root / "run" / f"{name}.pid"

    def _log(self, name: str) -> Path:
        return self.root / "log" / f"{name}.log"

    # ---- public API -------------------------------------------------------------------------
    def __enter__(self) -> LocalSlurmCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Write the configs and start every daemon; return once all nodes are idle.

        On failure everything started is stopped again and the error carries the log tails.
        """
        missing = missing_binaries()
        if missing:
            raise SlurmClusterError(f"not installed: {', '.join(missing)} (see ensure_installed)")
        self._stop_daemons()  # leftovers of a crashed run under the same root
        deadline = time.monotonic() + timeout
        try:
            add_host_names(self.node_names, self.root, self.hosts_file)  # MASTER_ADDR is n1
            self._prepare()
            self._start_munge(deadline)
            if self.accounting:
                self._start_accounting(deadline)
            self._start_slurm(deadline)
        except BaseException as exc:
            failed = exc.daemon if isinstance(exc, SlurmClusterError) else None
            report = self._diagnostics(failed)
            self._stop_daemons()
            remove_host_names(self.root, self.hosts_file)
            if isinstance(exc, SlurmClusterError):
                where = f"logs under {self.root / 'log'}"
                raise SlurmClusterError(f"{exc} ({where})\n{report}", failed) from exc
            raise

    def stop(self) -> None:
        """Cancel all jobs, wait for the queue to drain, then stop daemons by their pid files.

        Order matters: killing slurmd before its jobs end leaves slurmstepd and job processes
        behind. Any stray job process of this cluster is killed last as a safety net.
        """
        if self._running("slurmctld"):
            self._cancel_all_jobs()
        self._stop_daemons()
        remove_host_names(self.root, self.hosts_file)

    def run(
        self, cmd: Sequence[str] | str, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (``"sinfo -N"`` or a list) against this cluster."""
        argv = cmd.split() if isinstance(cmd, str) else list(cmd)
        return subprocess.run(
            argv,
            env=self._client_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def node_states(self) -> dict[str, str]:
        """Node name -> state as sinfo reports it (e.g. ``idle``, ``mixed``, ``unknown*``)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def job_ids(self) -> list[str]:
        """Ids of jobs slurmctld still knows as pending, running or completing."""
        out = self.run(["squeue", "-h", "-o", "%A"], check=False)
        if out.returncode != 0:
            raise SlurmClusterError(f"squeue failed: {out.stderr.strip()}")
        return out.stdout.split()

    def status(self) -> dict[str, object]:
        """Which daemons run (by pid file) and what sinfo/squeue say, for the CLI and debugging."""
        daemons = {p.stem: pid_alive(_read_pid(p)) for p in sorted(self.root.glob("run/*.pid"))}
        info: dict[str, object] = {"root": str(self.root), "env": self.env, "daemons": daemons}
        if self._running("slurmctld"):
            info["nodes"] = self.node_states()
            info["jobs"] = self.job_ids()
        return info

    # ---- configuration -------------------------------------------------------------------
    def _prepare(self) -> None:
        """Create the folder tree, munge key and configs; ports are chosen afresh each start."""
        for sub in ("etc", "log", "run/slurm", "state/ctld", "spool", "db"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._prepare_munge()
        ports = free_ports(self.nodes + 3)
        self.ports = {
            "slurmctld": ports[0],
            "slurmdbd": ports[1],
            "mariadb": ports[2],
            **{n: p for n, p in zip(self.node_names, ports[3:], strict=True)},
        }
        (self.root / "etc" / "plugstack.conf").write_text("")  # no site SPANK plugins
        self.conf_path.write_text(self._slurm_conf())
        if self.accounting:
            dbd = self.root / "etc" / "slurmdbd.conf"
            dbd.write_text(self._slurmdbd_conf())
            dbd.chmod(0o600)  # slurmdbd refuses a config others can read (it holds a password)
        (self.root / "ports.json").write_text(json.dumps(self.ports, indent=1))

    def _prepare_munge(self) -> None:
        """munged checks permissions: key folder 0700, key 0600, socket folder 0755."""
        key_dir = self.root / "munge" / "etc"
        sock_dir = self.munge_socket.parent
        for d, mode in ((key_dir, 0o700), (sock_dir, 0o755), (self.root / "munge", 0o755)):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(mode)
        key = key_dir / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        for path in (self.munge_socket, self.root / "db" / "mysqld.sock"):
            if len(str(path)) > _UNIX_PATH_MAX:
                raise SlurmClusterError(f"root too deep for a unix socket path: {path}")

    def _slurm_conf(self) -> str:
        host = socket.gethostname().split(".")[0]
        r = self.root
        mem_mb = max(1024, _total_memory_mb() // self.nodes)
        lines = [
            f"ClusterName={self.cluster_name}",
            # slurmctld only starts on a host named in SlurmctldHost; clients use the address.
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.ports['slurmctld']}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
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
            *self._accounting_lines(),
            *self._node_lines(host, mem_mb),
            f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        return "\n".join(lines) + "\n"

    def _accounting_lines(self) -> list[str]:
        if not self.accounting:
            return ["AccountingStorageType=accounting_storage/none"]
        return [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={self.ports['slurmdbd']}",
            # For the slurmdbd connection the "password" is the munge socket; AuthInfo is
            # not used there, and the default /run/munge socket does not exist.
            f"AccountingStoragePass={self.munge_socket}",
        ]

    def _node_lines(self, host: str, mem_mb: int) -> list[str]:
        """One line per node, each at NodeAddr 127.0.0.1 (every node is this host)."""
        return [
            f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={self.ports[n]} "
            f"CPUs={self.cpus_per_node} RealMemory={mem_mb} State=UNKNOWN"
            for n in self.node_names
        ]

    def _slurmdbd_conf(self) -> str:
        host = socket.gethostname().split(".")[0]
        r = self.root
        lines = [
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"DbdHost={host}",
            "DbdAddr=127.0.0.1",
            f"DbdPort={self.ports['slurmdbd']}",
            "SlurmUser=root",
            f"PidFile={r}/run/slurm/slurmdbd.pid",
            f"LogFile={r}/log/slurmdbd.log",
            "DebugLevel=info",
            "StorageType=accounting_storage/mysql",
            # TCP, because slurmdbd has no setting for a MariaDB socket path.
            "StorageHost=127.0.0.1",
            f"StoragePort={self.ports['mariadb']}",
            "StorageUser=slurm",
            "StoragePass=unused",  # MariaDB runs with --skip-grant-tables, local only
            "StorageLoc=slurm_acct_db",
        ]
        return "\n".join(lines) + "\n"

    # ---- daemons ----------------------------------------------------------------------------
    def _daemon_env(self) -> dict[str, str]:
        """The caller's env minus any SLURM_* of an enclosing job, plus our SLURM_CONF."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
        env["PATH"] = _SEARCH_PATH
        return {**env, **self.env}

    def _client_env(self) -> dict[str, str]:
        return {**os.environ, "PATH": _SEARCH_PATH, **self.env}

    def _spawn(self, name: str, argv: list[str]) -> None:
        """Start a daemon in the foreground of its own session and record its pid.

        Foreground (-D/-F) keeps the pid we record the daemon's real pid, and keeps it our
        child so ``stop()`` can reap it; its own session keeps Ctrl-C in a terminal from
        reaching it. The process outlives this Python process (needed for the CLI).
        """
        with self._log(f"{name}-stdout").open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._daemon_env(),
                cwd=self.root,
                start_new_session=True,
            )
        self._procs[name] = proc
        self._pid_file(name).write_text(f"{proc.pid}\n")

    def _wait_for(self, what: str, ready: Callable[[], bool], deadline: float, name: str) -> None:
        """Poll ``ready()`` until true; fail early if daemon ``name`` died, or at the deadline."""
        while not ready():
            if not self._running(name):
                raise SlurmClusterError(f"{name} exited while waiting for {what}", name)
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"timed out waiting for {what}", name)
            time.sleep(0.2)

    def _start_munge(self, deadline: float) -> None:
        m = self.root / "munge"
        with contextlib.suppress(FileNotFoundError):
            self.munge_socket.unlink()
        argv = [
            _bin("munged"), "-F", "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={m / 'etc' / 'munge.key'}",
            f"--pid-file={m / 'run' / 'munged.pid'}",
            f"--log-file={self._log('munged')}",
            f"--seed-file={m / 'etc' / 'munged.seed'}",
        ]  # fmt: skip
        self._spawn("munged", argv)
        self._wait_for("the munge socket", self.munge_socket.exists, deadline, "munged")

    def _start_accounting(self, deadline: float) -> None:
        """Private MariaDB (own datadir, TCP port, no grants) and slurmdbd on top of it."""
        data = self.root / "db" / "data"
        if not (data / "mysql").is_dir():
            self._init_mariadb(data)
        argv = [
            _bin("mariadbd"), "--no-defaults", "--user=root",
            f"--datadir={data}",
            f"--socket={self.root / 'db' / 'mysqld.sock'}",
            f"--pid-file={self.root / 'db' / 'mariadbd.pid'}",
            f"--log-error={self._log('mariadb')}",
            "--bind-address=127.0.0.1", f"--port={self.ports['mariadb']}",
            "--skip-grant-tables", "--skip-name-resolve",
            *_MARIADB_SIZES,
        ]  # fmt: skip
        self._spawn("mariadbd", argv)
        self._wait_for("MariaDB", lambda: _port_open(self.ports["mariadb"]), deadline, "mariadbd")
        # slurmdbd has no -f: it reads slurmdbd.conf next to $SLURM_CONF.
        self._spawn("slurmdbd", [_bin("slurmdbd"), "-D"])
        self._wait_for("slurmdbd", lambda: _port_open(self.ports["slurmdbd"]), deadline, "slurmdbd")

    def _init_mariadb(self, data: Path) -> None:
        cmd = [
            _bin("mariadb-install-db"), "--no-defaults", "--user=root", f"--datadir={data}",
            "--auth-root-authentication-method=socket", "--skip-test-db", *_MARIADB_SIZES,
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise SlurmClusterError(f"mariadb-install-db failed:\n{done.stdout}{done.stderr}")

    def _start_slurm(self, deadline: float) -> None:
        conf = str(self.conf_path)
        self._spawn("slurmctld", [_bin("slurmctld"), "-D", "-f", conf])
        ctld_up = lambda: _port_open(self.ports["slurmctld"])  # noqa: E731
        self._wait_for("slurmctld", ctld_up, deadline, "slurmctld")
        for node in self.node_names:
            (self.root / "spool" / node).mkdir(exist_ok=True)
            self._spawn(f"slurmd-{node}", [_bin("slurmd"), "-D", "-f", conf, "-N", node])
        for node in self.node_names:
            self._wait_for(f"node {node} idle", lambda n=node: self._node_idle(n), deadline,
                           f"slurmd-{node}")  # fmt: skip

    def _node_idle(self, node: str) -> bool:
        return self.node_states().get(node) == "idle"

    def _running(self, name: str) -> bool:
        pid_file = self._pid_file(name)
        return pid_file.exists() and pid_alive(_read_pid(pid_file))

    def _cancel_all_jobs(self) -> None:
        """scancel every job and wait until slurmctld has none left (including COMPLETING)."""
        deadline = time.monotonic() + CANCEL_TIMEOUT_S
        with contextlib.suppress(SlurmClusterError, subprocess.TimeoutExpired):
            ids = self.job_ids()
            if ids:
                self.run(["scancel", *ids], check=False)
            while self.job_ids() and time.monotonic() < deadline:
                time.sleep(0.3)

    def _stop_daemons(self) -> None:
        """SIGTERM, then SIGKILL, each daemon in dependency order (nodes first, munge last)."""
        order = [f"slurmd-{n}" for n in self.node_names]
        order += ["slurmctld", "slurmdbd", "mariadbd", "munged"]
        order += [p.stem for p in self.root.glob("run/*.pid") if p.stem not in order]
        for name in order:
            self._stop_one(name)
        self._kill_strays()

    def _stop_one(self, name: str) -> None:
        pid_file = self._pid_file(name)
        if not pid_file.exists():
            return
        pid = _read_pid(pid_file)
        if pid > 0 and pid_alive(pid):
            _terminate(pid, STOP_TIMEOUT_S, self._procs.get(name))
        self._reap(name)
        pid_file.unlink(missing_ok=True)

    def _reap(self, name: str) -> None:
        """Collect the exit status of a daemon we spawned, so no zombie stays in our table."""
        proc = self._procs.pop(name, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)

    def processes(self) -> list[tuple[int, str]]:
        """(pid, name) of live processes of this cluster: daemons, slurmstepd, job tasks.

        A process belongs to the cluster when its environment holds our SLURM_CONF (daemons
        get it from ``_spawn``, steps and tasks from slurmd) and it is a Slurm/munge/MariaDB
        process or a job task (has SLURM_JOB_ID). Clusters under other roots never match,
        nor does a shell that merely exported SLURM_CONF.
        """
        return list(_cluster_processes(str(self.conf_path)))

    def _kill_strays(self) -> None:
        """Safety net after stopping the daemons: kill whatever of this cluster still runs."""
        for pid, _ in self.processes():
            _terminate(pid, 2.0, None)

    def _diagnostics(self, failed: str | None) -> str:
        """Log tails of every daemon, the failed one's first, for the error of a failed start."""
        logs = sorted(self.root.glob("log/*.log"))
        if failed:
            prefix = failed.split("-")[0]  # slurmd-n1 -> slurmd-n1.log and slurmd-n1-stdout.log
            logs.sort(key=lambda p: not p.name.startswith((failed, prefix)))
        return "\n".join(_tail(p) for p in logs if p.stat().st_size)


def _bin(name: str) -> str:
    path = which(name)
    if path is None:
        raise SlurmClusterError(f"{name} not found; run ensure_installed() first")
    return path


def _read_pid(pid_file: Path) -> int:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1


def _total_memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 4096


def _terminate(pid: int, timeout: float, proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, wait up to ``timeout`` (reaping our own children), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        end = time.monotonic() + wait
        while time.monotonic() < end:
            if proc is not None and proc.poll() is not None:
                return
            if not pid_alive(pid):
                return
            time.sleep(0.05)


def _cluster_processes(conf: str) -> Iterator[tuple[int, str]]:
    """Live (pid, name), not ours, of daemons/steps/tasks whose environment names ``conf``."""
    marker = f"SLURM_CONF={conf}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            name = (proc / "comm").read_text().strip()
        except OSError:
            continue
        if marker not in environ or not pid_alive(int(proc.name)):
            continue
        is_job = any(v.startswith(b"SLURM_JOB_ID=") for v in environ)
        if name in PROCESS_NAMES or is_job:
            yield int(proc.name), name


# ---- a job function for smoke tests (importable, so submitit can pickle it by reference) ------
def _smoke_allreduce() -> tuple[int, int, float]:
    """One rank of a Slurm job: gloo init from submitit's env, all_reduce(rank + 1).

    Returns (rank, world_size, sum), where the sum is world_size * (world_size + 1) / 2.
    The rendezvous is at the first node by name (n1): the cluster made it resolve to 127.0.0.1
    (all fake nodes are this host), so a name that does not resolve fails here at once.
    """
    from datetime import timedelta

    import submitit
    import torch
    import torch.distributed as dist

    denv = submitit.helpers.TorchDistributedEnvironment()
    denv.export(set_cuda_visible_devices=False, overwrite=True)
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


# ---- CLI -----------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """``up`` / ``down`` / ``status`` ROOT; ``up`` prints the export line for clients."""
    parser = argparse.ArgumentParser(
        prog="python -m tools.slurm_local",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("root", type=Path)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cpus-per-node", type=int, default=8)
    parser.add_argument("--no-accounting", action="store_true")
    parser.add_argument("--no-install", action="store_true", help="do not apt-get install")
    args = parser.parse_args(argv)
    cluster = LocalSlurmCluster(args.root, args.nodes, args.cpus_per_node, not args.no_accounting)
    if args.action == "down":
        cluster.stop()
        print(f"stopped cluster under {cluster.root}")
        return 0
    if args.action == "status":
        print(json.dumps(cluster.status(), indent=1))
        return 0
    return _cli_up(cluster, install=not args.no_install)


def _cli_up(cluster: LocalSlurmCluster, install: bool) -> int:
    reason = ensure_installed() if install else None
    if reason is not None:
        print(f"cannot start Slurm: {reason}", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    try:
        cluster.start()
    except SlurmClusterError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"cluster up in {time.monotonic() - t0:.1f} s; partition {cluster.partition!r}")
    print(f"export SLURM_CONF={cluster.conf_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
