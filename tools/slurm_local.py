"""A Slurm cluster of one or more nodes on localhost, for tests and benchmarks.

::

    python tools/slurm_local.py start /tmp/slurm --cpus 8   # prints the SLURM_CONF to export
    SLURM_CONF=/tmp/slurm/slurm.conf sbatch --wrap "hostname"
    python tools/slurm_local.py stop /tmp/slurm
    python tools/slurm_local.py start /tmp/slurm2 --nodes 2  # nodes n1 and n2

or from Python::

    with LocalSlurm(tmp_path / "slurm", cpus=8) as slurm:
        subprocess.run(["sbatch", "--wrap", "true"], env=slurm.env, check=True)

Everything lives under the root directory: slurm.conf, a munge key and munged's own
socket, state, spool, logs and pid files; the ports are free ones picked at start, so
several clusters (one per engineer or test session) run side by side with the system's.
One node is ``localhost``; with ``nodes=N`` (N > 1) the nodes are ``n1`` ... ``nN``, each
its own slurmd (``slurmd -N n2``) on its own port, all with ``NodeHostname=localhost`` and
``NodeAddr=127.0.0.1``, so ``sbatch -N 2`` + ``srun`` runs one task on each "node" of one
machine (``SLURMD_NODENAME`` and ``SLURM_NODEID`` tell them apart). Each node has
``cpus`` CPUs however many the machine has (``SlurmdParameters=config_overrides``): CPUs
are the scheduling slots (``CR_CPU``), and no cgroups are used (``proctrack/linuxproc``,
``task/none``), so it runs in containers.
There is no accounting database: ``scontrol show job`` and ``squeue --states=all`` know
finished jobs for ``MinJobAge`` seconds, and ``JobCompType=jobcomp/filetxt`` keeps one
line per finished job in ``log/jobcomp.txt``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import types
import zlib
from pathlib import Path

from acceptrun._util.net import free_port

__all__ = ["LocalSlurm", "SlurmStartError"]

START_TIMEOUT_S = 300.0  # seconds a daemon or node may take to be up; returns when it is
STOP_TIMEOUT_S = 15.0  # seconds a daemon gets after SIGTERM before SIGKILL
DAEMONS = ("slurmd", "slurmctld", "munged")  # stop order: the node first, munge last
TAIL_LINES = 15  # log lines quoted when the cluster does not come up


class SlurmStartError(RuntimeError):
    """The local cluster did not come up; the message quotes the daemons' logs."""


def _free_port() -> int:
    # Outside the kernel's ephemeral range: a daemon binds it seconds later, and a port
    # the kernel hands out itself could meanwhile go to any other socket (srun's).
    return free_port("127.0.0.1")


def _memory_mb() -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 4096


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"  ({path}: no log)"
    return "\n".join(f"  {line}" for line in text[-lines:]) or f"  ({path}: empty)"


class LocalSlurm:
    """slurmctld, munged and one slurmd per node, all state under ``root``."""

    def __init__(
        self, root: Path, cpus: int = 8, scheduler: str = "builtin", nodes: int = 1
    ) -> None:
        if scheduler not in ("builtin", "backfill"):
            raise ValueError(f"scheduler {scheduler!r}: use 'builtin' or 'backfill'")
        if nodes < 1:
            raise ValueError(f"nodes={nodes}: a cluster has at least 1 node")
        self.root = Path(root).resolve()
        self.cpus = cpus
        # One node keeps its historical name; several are n1..nN (slurmd -N picks one).
        self.nodes = ["localhost"] if nodes == 1 else [f"n{i}" for i in range(1, nodes + 1)]
        self.scheduler = scheduler
        self.conf = self.root / "slurm.conf"
        self.log_dir = self.root / "log"
        self.run_dir = self.root / "run"
        self.munge_socket = self.root / "munge" / "munge.socket"

    # ---- the interface ------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` set: for sbatch, squeue, scontrol."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> LocalSlurm:
        """Write the configuration, start munged, slurmctld and the slurmds; wait for idle nodes."""
        missing = [d for d in (*DAEMONS, "sinfo", "sbatch") if not _which(d)]
        if missing:
            raise SlurmStartError(
                f"{', '.join(missing)} not found: install the Debian packages slurm-wlm and "
                "munge (`apt-get install slurm-wlm munge`)"
            )
        self.stop()  # a cluster left running in this directory by an earlier start
        for sub in ("state", "spool", "log", "run", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        for node in self.nodes:
            (self.root / "spool" / node).mkdir(exist_ok=True, mode=0o700)
        self._write_munge_key()
        self._write_conf()
        try:
            self._start_munged()
            self._start_daemon("slurmctld", ["-f", str(self.conf)])
            # -N: the node's name in slurm.conf (localhost, n1, n2 ...), whatever the
            # host is called; each slurmd writes its own pid file (slurmd-%n.pid).
            for node in self.nodes:
                self._start_daemon("slurmd", ["-f", str(self.conf), "-N", node], node=node)
            self._wait_idle()
        except BaseException:
            self.stop()  # no daemon outlives a failed start
            raise
        return self

    def stop(self) -> None:
        """Stop the daemons started in this directory (by their pid files) and wait for them."""
        for name, node in self._daemons():
            pid = self._pid(name, node)
            if pid is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                while _alive(pid):
                    time.sleep(0.05)
            self._pid_file(name, node).unlink(missing_ok=True)

    def _daemons(self) -> list[tuple[str, str | None]]:
        """(daemon, node) in stop order; a node's slurmd by the pid files it left."""
        nodes = {p.name[len("slurmd-") : -len(".pid")] for p in self.run_dir.glob("slurmd-*.pid")}
        nodes.update(self.nodes)
        slurmds: list[tuple[str, str | None]] = [("slurmd", n) for n in sorted(nodes)]
        return [*slurmds, ("slurmd", None), ("slurmctld", None), ("munged", None)]

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.stop()

    # ---- configuration --------------------------------------------------------------------

    def _write_munge_key(self) -> None:
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(1024))

    def _write_conf(self) -> None:
        r = self.root
        user = _user()
        # A cluster name per directory: slurmctld refuses state saved by another cluster.
        cluster = f"acceptrun{zlib.crc32(str(r).encode()):08x}"
        lines = [
            f"ClusterName={cluster}",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire: also how long a requeued job waits before it may start again
            # (seconds; 120 by default, too long for tests).
            f"AuthInfo=socket={self.munge_socket},cred_expire=5",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            f"SlurmctldPidFile={self.run_dir / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.run_dir / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}",
            f"SlurmdLogFile={self.log_dir / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # No cgroups: containers rarely delegate them. Processes are tracked by parentage.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.log_dir / 'jobcomp.txt'}",
            # Quick scheduling: the main scheduler runs at every event and at least every
            # second; builtin is FIFO (tests), backfill is Slurm's default (benchmarks),
            # its pass every second too.
            f"SchedulerType=sched/{self.scheduler}",
            "SchedulerParameters=sched_interval=1,sched_min_interval=100000"
            + (",bf_interval=1,bf_resolution=1" if self.scheduler == "backfill" else ""),
            "MessageTimeout=10",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            # seconds between SIGTERM and SIGKILL when a job is cancelled or requeued: long
            # enough for a checkpoint and the close of the run on a busy machine
            "KillWait=120",
            "MinJobAge=600",  # seconds a finished job stays visible to scontrol/squeue
            "ReturnToService=2",
            "JobRequeue=1",
            "PrologFlags=",
            *self._node_lines(),
            f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE "
            "State=UP",
        ]
        self.conf.write_text("\n".join(line for line in lines if not line.endswith("=")) + "\n")

    def _node_lines(self) -> list[str]:
        """One NodeName line per node; several nodes share 127.0.0.1 on ports of their own."""
        memory = _memory_mb()
        if self.nodes == ["localhost"]:
            return [
                f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} "
                f"RealMemory={memory} State=UNKNOWN"
            ]
        return [
            f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={_free_port()} "
            f"CPUs={self.cpus} RealMemory={memory} State=UNKNOWN"
            for node in self.nodes
        ]

    # ---- daemons --------------------------------------------------------------------------

    def _start_munged(self) -> None:
        d = self.root / "munge"
        cmd = [
            _which("munged") or "munged",
            f"--socket={self.munge_socket}",
            f"--key-file={d / 'munge.key'}",
            f"--pid-file={self.run_dir / 'munged.pid'}",
            f"--log-file={self.log_dir / 'munged.log'}",
            f"--seed-file={d / 'munged.seed'}",
            "--force",  # runs as root and in a directory it does not otherwise trust
        ]
        self._run_daemon("munged", cmd, self.log_dir / "munged.log")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.munge_socket.exists():
            if time.monotonic() > deadline:
                raise SlurmStartError(
                    f"munged did not create {self.munge_socket} within {START_TIMEOUT_S:.0f} s:\n"
                    + _tail(self.log_dir / "munged.log")
                )
            time.sleep(0.05)

    def _start_daemon(self, name: str, args: list[str], node: str | None = None) -> None:
        log = self.log_dir / (f"{name}-{node}.log" if node else f"{name}.log")
        self._run_daemon(name, [_which(name) or name, *args], log, node=node)

    def _run_daemon(self, name: str, cmd: list[str], log: Path, node: str | None = None) -> None:
        """Run a daemon that forks into the background; its pid file says where it went."""
        proc = subprocess.run(
            cmd, env=self.env, capture_output=True, text=True, timeout=60, check=False
        )
        if proc.returncode != 0:
            raise SlurmStartError(
                f"{name} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}\n"
                + _tail(log)
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while self._pid(name, node) is None:
            if time.monotonic() > deadline:
                raise SlurmStartError(
                    f"{name} wrote no pid file within {START_TIMEOUT_S:.0f} s:\n" + _tail(log)
                )
            time.sleep(0.05)

    def _pid_file(self, name: str, node: str | None = None) -> Path:
        return self.run_dir / (f"{name}-{node}.pid" if node else f"{name}.pid")

    def _pid(self, name: str, node: str | None = None) -> int | None:
        """The pid in ``name``'s pid file (a node's slurmd: its own), if alive and ``name``."""
        try:
            pid = int(self._pid_file(name, node).read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return None
        return pid if comm == name else None

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        state = ""
        while time.monotonic() < deadline:
            proc = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %T"],
                env=self.env, capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            state = (proc.stdout or proc.stderr).strip()
            rows = dict(line.split(None, 1) for line in state.splitlines() if " " in line)
            if proc.returncode == 0 and all(
                rows.get(n, "").rstrip("*") == "idle" for n in self.nodes
            ):
                return
            time.sleep(0.2)
        logs = "\n".join(
            f"{log.name}:\n{_tail(log)}"
            for log in [self.log_dir / "slurmctld.log"]
            + [self.log_dir / f"slurmd-{n}.log" for n in self.nodes]
        )
        raise SlurmStartError(
            f"the nodes did not become idle within {START_TIMEOUT_S:.0f} s "
            f"(sinfo says {state!r}); {self.conf}\n{logs}"
        )


def _which(name: str) -> str | None:
    # Daemons live in /usr/sbin, which is not on every PATH.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (an exited child of this process not yet reaped) counts as gone.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="A Slurm cluster of one or more nodes on localhost.")
    sub = p.add_subparsers(dest="action", required=True)
    start = sub.add_parser("start", help="start the cluster in DIR")
    start.add_argument("dir", type=Path)
    start.add_argument("--cpus", type=int, default=8, help="CPUs of each node (default 8)")
    start.add_argument(
        "--nodes", type=int, default=1, help="nodes (default 1; 2 or more: n1, n2, ...)"
    )
    stop = sub.add_parser("stop", help="stop the cluster in DIR")
    stop.add_argument("dir", type=Path)
    args = p.parse_args(argv)
    if args.action == "start":
        try:
            slurm = LocalSlurm(args.dir, cpus=args.cpus, nodes=args.nodes).start()
        except SlurmStartError as exc:
            print(f"slurm_local: {exc}", file=sys.stderr)
            return 1
        print(f"export SLURM_CONF={slurm.conf}")
        return 0
    LocalSlurm(args.dir).stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
