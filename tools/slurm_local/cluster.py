"""LocalSlurmCluster: the daemons of a one-host cluster under one root folder, started in
dependency order (munged, MariaDB + slurmdbd, slurmctld, one slurmd per fake node) and stopped
in reverse, every job cancelled first (see tools.slurm_local for the why)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from tools.slurm_local.config import write_configs
from tools.slurm_local.host import HOSTS_FILE, add_host_names, free_ports, port_open, remove_host_names
from tools.slurm_local.install import SEARCH_PATH, missing_binaries, which
from tools.slurm_local.processes import cluster_processes, pid_alive, read_pid, terminate

_UNIX_PATH_MAX = 107  # sun_path is 108 bytes including the trailing NUL
START_TIMEOUT_S = 60.0
CANCEL_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
# Small InnoDB files: a test database needs ~30 MB on disk instead of ~110 MB.
_MARIADB_SIZES = ("--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M")


class SlurmClusterError(RuntimeError):
    """The local cluster could not be started or stopped; the message carries log tails."""

    def __init__(self, message: str, daemon: str | None = None) -> None:
        super().__init__(message)
        self.daemon = daemon  # the daemon that failed, whose logs are shown first


def _tail(path: Path, lines: int = 15) -> str:
    """Last lines of a log, for error messages that explain why a daemon did not come up."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"--- {path.name}: (no file)"
    return "\n".join([f"--- {path.name}:", *text[-lines:]])


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
        daemons = {p.stem: pid_alive(read_pid(p)) for p in sorted(self.root.glob("run/*.pid"))}
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
        write_configs(self)

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

    # ---- daemons ----------------------------------------------------------------------------
    def _daemon_env(self) -> dict[str, str]:
        """The caller's env minus any SLURM_* of an enclosing job, plus our SLURM_CONF."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
        env["PATH"] = SEARCH_PATH
        return {**env, **self.env}

    def _client_env(self) -> dict[str, str]:
        return {**os.environ, "PATH": SEARCH_PATH, **self.env}

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
        files = {
            "--socket": self.munge_socket,
            "--key-file": m / "etc" / "munge.key",
            "--pid-file": m / "run" / "munged.pid",
            "--log-file": self._log("munged"),
            "--seed-file": m / "etc" / "munged.seed",
        }
        self._spawn("munged", [_bin("munged"), "-F", "--force", *_options(files)])
        self._wait_for("the munge socket", self.munge_socket.exists, deadline, "munged")

    def _start_accounting(self, deadline: float) -> None:
        """Private MariaDB (own datadir, TCP port, no grants) and slurmdbd on top of it."""
        data = self.root / "db" / "data"
        if not (data / "mysql").is_dir():
            self._init_mariadb(data)
        files = {
            "--datadir": data,
            "--socket": self.root / "db" / "mysqld.sock",
            "--pid-file": self.root / "db" / "mariadbd.pid",
            "--log-error": self._log("mariadb"),
        }
        argv = [
            _bin("mariadbd"), "--no-defaults", "--user=root", *_options(files),
            "--bind-address=127.0.0.1", f"--port={self.ports['mariadb']}",
            "--skip-grant-tables", "--skip-name-resolve",
            *_MARIADB_SIZES,
        ]  # fmt: skip
        self._spawn("mariadbd", argv)
        self._wait_for("MariaDB", lambda: port_open(self.ports["mariadb"]), deadline, "mariadbd")
        # slurmdbd has no -f: it reads slurmdbd.conf next to $SLURM_CONF.
        self._spawn("slurmdbd", [_bin("slurmdbd"), "-D"])
        self._wait_for("slurmdbd", lambda: port_open(self.ports["slurmdbd"]), deadline, "slurmdbd")

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
        ctld_up = lambda: port_open(self.ports["slurmctld"])  # noqa: E731
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
        return pid_file.exists() and pid_alive(read_pid(pid_file))

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
        pid = read_pid(pid_file)
        if pid > 0 and pid_alive(pid):
            terminate(pid, STOP_TIMEOUT_S, self._procs.get(name))
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
        return list(cluster_processes(str(self.conf_path)))

    def _kill_strays(self) -> None:
        """Safety net after stopping the daemons: kill whatever of this cluster still runs."""
        for pid, _ in self.processes():
            terminate(pid, 2.0, None)

    def _diagnostics(self, failed: str | None) -> str:
        """Log tails of every daemon, the failed one's first, for the error of a failed start."""
        logs = sorted(self.root.glob("log/*.log"))
        if failed:
            prefix = failed.split("-")[0]  # slurmd-n1 -> slurmd-n1.log and slurmd-n1-stdout.log
            logs.sort(key=lambda p: not p.name.startswith((failed, prefix)))
        return "\n".join(_tail(p) for p in logs if p.stat().st_size)


def _options(values: dict[str, object]) -> list[str]:
    """``--flag=value`` for each flag, in order: the files a daemon keeps under the cluster's root."""
    return [f"{flag}={value}" for flag, value in values.items()]


def _bin(name: str) -> str:
    path = which(name)
    if path is None:
        raise SlurmClusterError(f"{name} not found; run ensure_installed() first")
    return path
