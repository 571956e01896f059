"""One attempt's child process: its own process group, output teed to logs and terminal.

The child runs in a new session (its own process group), so that

- a Ctrl-C in the terminal reaches the supervisor only, which turns it into a graceful
  stop for the whole group instead of killing the workload mid-step;
- a stop or kill reaches every process the workload started (data-loader workers,
  torchrun's ranks), and nothing it started outlives the attempt.

A process that leaves the group (``setsid``) is still the attempt's: the attempt's
:class:`~acceptrun.supervisor.containment.Containment` (a cgroup, or the supervisor as
child subreaper) finds it, and :meth:`ChildProcess.finish` kills it with the rest.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from acceptrun._util.controls import LiveEcho
from acceptrun._util.durable import storage_fault
from acceptrun.checkpoint.memtier import ENV_MEMORY_DIR, prepare
from acceptrun.record.lease import process_start_time
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec
from acceptrun.supervisor.containment import Containment
from acceptrun.supervisor.lease import die_with_supervisor
from acceptrun.workload.contract import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_RESUME_FROM,
    ENV_RUN_DIR,
    ENV_RUN_ID,
    ENV_SPEC,
)
from acceptrun.workload.liveness import supervisor_env

__all__ = ["UNBUFFERED", "Arrivals", "ChildProcess", "contract_env", "python_output"]

_CHUNK = 64 * 1024  # bytes per read from the child's pipes
_ARRIVALS_KEPT = 1 << 16  # chunks whose arrival time is kept per log (about 1 MiB of state)


class Arrivals:
    """When the output tee read each chunk of one log: its end offset in the file, and the
    unix time the pipe handed it over.

    A line's arrival is the earliest time it is known to have been printed by: what the
    checkpoint watcher dates a save by (a step line read before the file was written was
    printed before it; supervisor/external.py). The tee stamps, writes and notes a chunk
    under :attr:`lock`, and a reader takes its own time under it too
    (:meth:`read_time`): every chunk stamped before that time is then in the file.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._ends: list[int] = []
        self._times: list[float] = []

    def note(self, end: int, t: float) -> None:
        """The chunk ending at byte ``end`` arrived at ``t`` (call it holding :attr:`lock`)."""
        self._ends.append(end)
        self._times.append(t)
        if len(self._ends) > 2 * _ARRIVALS_KEPT:  # the oldest half: lines read long ago
            del self._ends[:_ARRIVALS_KEPT], self._times[:_ARRIVALS_KEPT]

    def read_time(self) -> float:
        """Now, after every chunk stamped before now is in the file."""
        with self.lock:
            return time.time()

    def time_of(self, end: int) -> float | None:
        """The arrival of the byte before offset ``end`` (None: not kept, or not yet read)."""
        with self.lock:
            i = bisect.bisect_left(self._ends, end)
            return self._times[i] if i < len(self._times) else None


UNBUFFERED = "PYTHONUNBUFFERED"


def python_output(env: dict[str, str], spec_env: Mapping[str, str], enabled: bool) -> str:
    """Give the job ``PYTHONUNBUFFERED=1`` unless something else decides; say who decided.

    Python writes stdout into a pipe in 8 KiB blocks: a black box's step lines reached
    acceptrun 20 to 60 steps late, and captures were dated by them. Set for every command
    (a shell script or a launcher may start Python), it changes nothing for other programs.
    Returns ``"env"`` (the spec's [env] sets it, kept as given), ``"off"``
    (``python_unbuffered = false``: left as inherited), ``"inherited"`` (acceptrun's own
    environment already holds a non-empty value, which Python reads as on) or
    ``"acceptrun"`` (set to 1 here). ``env`` is the job's environment, changed in place.
    """
    if UNBUFFERED in spec_env:
        env[UNBUFFERED] = spec_env[UNBUFFERED]
        return "env"
    if not enabled:
        return "off"
    if env.get(UNBUFFERED):  # Python: any non-empty value is -u; an empty one is not
        return "inherited"
    env[UNBUFFERED] = "1"
    return "acceptrun"


class ChildProcess:
    """A workload process whose stdout/stderr go to log files and, optionally, the terminal."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: str | Path,
        env: Mapping[str, str],
        stdout_path: Path,
        stderr_path: Path,
        echo: bool = True,
        containment: Containment | None = None,
        hold: bool = False,
        pass_fds: Sequence[int] = (),
    ) -> None:
        self.argv = list(argv)
        self.cwd = Path(cwd)
        self.env = dict(env)
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self.echo = echo
        self.containment = containment
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0  # time.time() at start
        self.started_mono = 0.0  # time.monotonic() at start
        self._threads: list[threading.Thread] = []
        self._exited = threading.Event()
        # When each chunk of the logs was read (the progress reader's line times).
        self.arrivals = {stdout_path: Arrivals(), stderr_path: Arrivals()}
        # A standby's output (supervisor/standby.py) is held here, neither logged nor
        # echoed, until release(): before its go it is no attempt of the record's.
        self._held: dict[Path, list[bytes]] | None = (
            {stdout_path: [], stderr_path: []} if hold else None
        )
        self._hold_lock = threading.Lock()
        self.pass_fds = tuple(pass_fds)  # kept open in the child (a standby's socket)

    @property
    def pid(self) -> int:
        assert self.proc is not None, "child not started"
        return self.proc.pid

    def start(self) -> None:
        """Start the child. Raises OSError when the command cannot be executed."""
        self.started_at = time.time()
        self.started_mono = time.monotonic()
        try:
            self.proc = self._popen()
        except subprocess.SubprocessError as exc:
            # Only the preexec step raises this: the cgroup refused the child before exec,
            # so nothing of the workload ran. Start it again, held by the subreaper.
            assert self.containment is not None and self.containment.cgroup is not None
            self.containment.degrade(f"the cgroup {self.containment.cgroup} refused it: {exc}")
            self.proc = self._popen()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        # One thread blocks in waitpid: the supervisor then sleeps on an Event that wakes
        # at once when the child exits. Popen.wait(timeout) instead polls up to 20 times a
        # second, which is most of an idle supervisor's CPU.
        waiter = threading.Thread(target=self._wait_exit, name="acceptrun-waitpid", daemon=True)
        waiter.start()
        for pipe, path, term in (
            (self.proc.stdout, self.stdout_path, sys.stdout),
            (self.proc.stderr, self.stderr_path, sys.stderr),
        ):
            t = threading.Thread(target=self._tee, args=(pipe, path, term), daemon=True)
            t.start()
            self._threads.append(t)

    def _popen(self) -> subprocess.Popen[bytes]:
        c = self.containment
        fd = None if c is None else c.before_fork()
        proc = None
        try:
            proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=_preexec(fd),
                pass_fds=self.pass_fds,
            )
        finally:
            if c is not None:
                c.after_fork(None if proc is None else proc.pid)
        return proc

    def release(self) -> None:
        """A held child's output from now on goes to its logs and the terminal, what it
        printed so far first (a standby that became an attempt)."""
        with self._hold_lock:
            held, self._held = self._held, None
            if held is None:
                return
            for path, term in ((self.stdout_path, sys.stdout), (self.stderr_path, sys.stderr)):
                data = b"".join(held[path])
                try:
                    with open(path, "ab") as log:
                        log.write(data)
                        end = log.tell()
                    with self.arrivals[path].lock:
                        self.arrivals[path].note(end, time.time())
                except OSError as exc:
                    self._log_lost(path, exc)
                out = getattr(term, "buffer", None) if self.echo else None
                if out is not None and data:
                    with contextlib.suppress(OSError, ValueError):
                        out.write(data)
                        out.flush()

    def adopt(self) -> None:
        """A held child (a standby) becomes the attempt: its clock starts now, its output
        goes to the logs (the attempt's folder must exist)."""
        self.started_at = time.time()
        self.started_mono = time.monotonic()
        self.release()

    def _held_chunk(self, path: Path, chunk: bytes) -> bool:
        """Keep ``chunk`` while the output is held; False once it is released."""
        with self._hold_lock:  # one uncontended lock per 64 KiB chunk
            if self._held is None:
                return False
            self._held[path].append(chunk)
            return True

    def _open_log(self, path: Path) -> tuple[IO[bytes] | None, int]:
        """The log, opened to append, and its size; None when it cannot be opened."""
        try:
            log = open(path, "ab")  # noqa: SIM115 - closed by the tee, or dropped on a write error
            return log, os.fstat(log.fileno()).st_size
        except OSError as exc:
            self._log_lost(path, exc)
            return None, 0

    def _tee(self, pipe: IO[bytes], path: Path, term: IO[str]) -> None:
        # Logs are flushed per chunk so `tail -f` and a crash both see everything.
        out = getattr(term, "buffer", None) if self.echo else None
        log: IO[bytes] | None = None
        arrivals = self.arrivals[path]
        end = 0
        opened = self._held is None  # a held child's log opens once its output is released
        if opened:
            log, end = self._open_log(path)
        fd = pipe.fileno()
        while True:
            try:
                chunk = os.read(fd, _CHUNK)
            except OSError:
                break
            if not chunk:
                break
            if self._held_chunk(path, chunk):
                continue
            if not opened:
                log, end = self._open_log(path)
                opened = True
            if log is not None:
                with arrivals.lock:
                    arrived = time.time()
                    try:
                        log.write(chunk)
                        log.flush()
                        end += len(chunk)
                        arrivals.note(end, arrived)
                    except OSError as exc:
                        # Keep draining the pipe: a full log must not block the workload.
                        self._log_lost(path, exc)
                        with contextlib.suppress(OSError):
                            log.close()
                        log = None
            if out is not None:
                with contextlib.suppress(OSError, ValueError):
                    out.write(chunk)
                    out.flush()
        if log is not None:
            with contextlib.suppress(OSError):
                log.close()
        if isinstance(out, LiveEcho):  # the last word and a key block it held
            with contextlib.suppress(OSError, ValueError):
                out.finish()
        pipe.close()

    @staticmethod
    def _log_lost(path: Path, exc: OSError) -> None:
        fault = storage_fault(exc) or "write failed"
        print(
            f"acceptrun: cannot write {path}: {fault} ({exc.strerror}); the workload's "
            "output is no longer logged there",
            file=sys.stderr,
            flush=True,
        )

    def _wait_exit(self) -> None:
        assert self.proc is not None
        self.proc.wait()
        self._exited.set()

    def poll(self) -> int | None:
        assert self.proc is not None, "child not started"
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait up to ``timeout`` seconds; the return code, or None if still running."""
        assert self.proc is not None, "child not started"
        if self._exited.wait(timeout):
            return self.proc.returncode
        return None

    def signal_group(self, sig: int) -> bool:
        """Send ``sig`` to the child's whole process group; False if it is already gone."""
        assert self.proc is not None, "child not started"
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def signal_leader(self, sig: int) -> bool:
        """Send ``sig`` to the process started, not its children; False if it is gone."""
        assert self.proc is not None, "child not started"
        if self._exited.is_set():
            return False
        try:
            os.kill(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def finish(self) -> list[int]:
        """After the child exits: kill what it left behind, then drain the pipes.

        A data-loader worker or a daemon the workload forgot would otherwise keep running
        (and keep holding the pipes open, so the logs would never close). Returns the
        pids killed outside the process group (the containment's and the marker's).
        """
        self.signal_group(signal.SIGKILL)
        killed = set(self.kill_strays())
        if self.containment is not None:
            killed.update(self.containment.kill())
            self.containment.close()
        for t in self._threads:
            t.join(timeout=5)
        return sorted(killed)

    def processes(self) -> list[int]:
        """The attempt's live processes (the containment's view, the leader at least)."""
        if self.containment is None:
            return [self.pid] if self.poll() is None else []
        return sorted(self.containment.pids())

    def kill_strays(self) -> list[int]:
        """SIGKILL the attempt's processes that left its process group; their pids.

        torchrun starts each rank in a session of its own, and any program may call
        setsid(): such a process escapes the group kill and, once its parent is gone,
        belongs to init. Every process the workload started carries the attempt's
        ``ACCEPTRUN_RUN_ID`` and ``ACCEPTRUN_ATTEMPT`` in its environment, which is how
        they are found (a program that clears its environment is not).
        """
        run_id = self.env.get(ENV_RUN_ID)
        attempt = self.env.get(ENV_ATTEMPT)
        if not run_id or not attempt:
            return []
        try:
            import psutil
        except ImportError:  # pragma: no cover - psutil is a dependency
            return []
        killed: list[int] = []
        me = os.getpid()
        for proc in psutil.process_iter():
            if proc.pid == me:
                continue
            try:
                env = proc.environ()
            except (psutil.Error, OSError):
                continue  # gone, a zombie, or another user's
            if env.get(ENV_RUN_ID) == run_id and env.get(ENV_ATTEMPT) == attempt:
                with contextlib.suppress(psutil.Error, OSError):
                    proc.kill()
                    killed.append(proc.pid)
        return killed

    @property
    def duration(self) -> float:
        return time.monotonic() - self.started_mono


def _preexec(cgroup_procs: int | None) -> Callable[[], None] | None:
    """Between fork and exec: enter the attempt's cgroup, then ask for the death signal.

    Entering first means nothing the workload starts is ever outside the cgroup. An
    OSError here fails the start with SubprocessError before anything of it ran.
    """
    death = die_with_supervisor()  # one prctl call, looked up before the fork
    if cgroup_procs is None:
        return death
    write = os.write

    def preexec() -> None:
        write(cgroup_procs, b"0")  # "0": the writing process itself
        if death is not None:
            death()

    return preexec


def contract_env(
    base: Mapping[str, str],
    spec: RunSpec,
    record: RunRecord,
    *,
    attempt: int,
    resume_from: str,
    checkpoint_dir: Path,
) -> dict[str, str]:
    """The workload's environment: ``base``, the spec's ``env``, then the contract's variables."""
    env = dict(base)
    env.update(spec.env)
    python_output(env, spec.env, spec.python_unbuffered)  # live prints (supervisor/process.py)
    env[ENV_RUN_DIR] = str(record.path)
    env[ENV_RUN_ID] = record.run_id
    env[ENV_ATTEMPT] = str(attempt)
    env[ENV_RESUME_FROM] = resume_from
    env[ENV_CHECKPOINT_DIR] = str(checkpoint_dir)
    env[ENV_SPEC] = str(record.spec_path)
    if spec.checkpoint.memory_every is not None and attempt > 0:  # 0: a restore drill
        env[ENV_MEMORY_DIR] = str(prepare(record))  # checkpoint/memtier.py; removed at close
    env.update(supervisor_env(os.getpid(), process_start_time()))  # workload/liveness.py
    return env
