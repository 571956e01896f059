"""The warm restart: the next attempt, started while one runs and waiting for its turn.

With ``limits.warm_restart = true`` the supervisor starts attempt N+1's process once
attempt N has logged its first step (not before: its start-up would slow N's). The
standby runs the script up to ``run.restore()``: the interpreter, the imports, the model
and data the script builds first. There it says ``ready`` on a socket pair it inherited
and waits (workload/standby.py). Before its go nothing of it is in the record as an
attempt: no ``attempt_start``, no ``workload_start``, no attempt folder, no steps; its
output is held in the supervisor's memory (:meth:`ChildProcess.release`).

When attempt N ends in a failure that is restarted, :meth:`StandbyKeeper.take` hands the
standby to the attempt loop, which records it as attempt N+1 (its number, environment,
process group and containment were N+1's from its start) and writes the go: the newest
verified checkpoint. The restart then costs the restore and a step, not a cold start.
When N ends any other way (success, a stop, a give-up) or the supervisor ends, the
standby is killed with its group (:meth:`StandbyKeeper.discard`) and leaves nothing:
its end of file ends it at once, with no exit hook.

A standby runs only where it is safe and pays: a client script (a black box has no
``run.restore()`` to wait in: it gets the event-driven detection and the backoff policy
only), one process (a torchrun group's ranks rendezvous at start), no watched
checkpoint files (their restore rewrites the command), no serving side task, and host
memory for a second copy of the script's set-up: available memory at least the active
attempt's resident set plus a tenth of the machine's. Each attempt's ``attempt_start``
says ``start_mode`` ("warm" or "cold") and, for a cold one, ``cold_why``; a skipped or
lost standby has its own event (``standby_skipped``, ``standby_lost``).

On a GPU the standby holds no device memory before its go unless the script's own code
before ``run.restore()`` puts something on the device: the client reports that at the
go (``standby_gpu``).
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec
from acceptrun.supervisor.containment import contain
from acceptrun.supervisor.process import ChildProcess
from acceptrun.workload.standby import ENV_STANDBY_FD, READY

__all__ = ["Standby", "StandbyKeeper", "memory_room"]

HEADROOM = 0.10  # of the machine's memory, left free beside the standby (host OOM margin)


@dataclass(slots=True)
class Standby:
    """A started standby: its process (output held), its socket, when it became ready."""

    child: ChildProcess
    sock: socket.socket
    for_attempt: int
    started: float  # monotonic s of its start
    ready_s: float | None = None  # seconds from its start to "ready" (in run.restore())
    ready: threading.Event = field(default_factory=threading.Event)

    def listen(self) -> None:
        """Read its "ready" on a thread of its own (the supervisor never blocks on it)."""

        def read() -> None:
            try:
                got = self.sock.recv(len(READY))
            except OSError:
                return
            if got == READY:
                self.ready_s = round(time.monotonic() - self.started, 3)
                self.ready.set()

        threading.Thread(target=read, name="acceptrun-standby", daemon=True).start()


def memory_room(pids: list[int]) -> tuple[bool, dict[str, Any]]:
    """Whether the host has room for a standby beside ``pids`` (the active attempt), and
    the figures (MiB) that decided it."""
    import psutil

    rss = 0
    for pid in pids:
        try:
            rss += psutil.Process(pid).memory_info().rss
        except (psutil.Error, OSError):
            continue
    mem = psutil.virtual_memory()
    need = rss + HEADROOM * mem.total
    mib = 1 << 20
    figures = {
        "available_mib": round(mem.available / mib),
        "attempt_rss_mib": round(rss / mib),
        "headroom_mib": round(HEADROOM * mem.total / mib),
    }
    return mem.available >= need, figures


class StandbyKeeper:
    """The supervisor's one standby: started beside an attempt, taken, or discarded.

    ``launch(attempt)`` gives the command and environment attempt ``attempt`` would get
    with no checkpoint to resume (the go names it).
    """

    def __init__(
        self,
        record: RunRecord,
        spec: RunSpec,
        *,
        client: bool,
        launch: Callable[[int], tuple[list[str], dict[str, str]]],
        echo: bool,
        side_task: bool = False,
    ) -> None:
        self.record = record
        self.spec = spec
        self.launch = launch
        self.echo = echo
        self.current: Standby | None = None
        self._tried: set[int] = set()  # active attempts a standby was considered for
        self.never = self._never(client, side_task)  # why no attempt of the run starts warm
        self.why_cold: str | None = self.never  # why the next attempt would start cold

    def _never(self, client: bool, side_task: bool) -> str | None:
        """Why no attempt of this run can start warm, or None."""
        spec = self.spec
        if not spec.limits.warm_restart:
            return "limits.warm_restart = false"
        if not client:
            return "a black box: no run.restore() to wait in"
        if spec.resources.processes > 1:
            return "resources.processes > 1: a torchrun group is not kept on standby"
        if spec.checkpoint.watch:
            return "checkpoint.watch: a watched file's restore changes the command"
        if side_task:
            return "a serving run"
        return None

    def consider(self, attempt: int, child: ChildProcess, stepped: bool) -> None:
        """Start the standby for ``attempt + 1`` once ``attempt`` has stepped (once)."""
        if self.never is not None or not stepped or attempt in self._tried:
            return
        self._tried.add(attempt)
        if self.current is not None:  # one left from before: never two
            self.discard()
        ok, figures = memory_room(child.processes())
        if not ok:
            self.why_cold = (
                f"no memory for a standby: {figures['available_mib']} MiB available, "
                f"attempt {attempt} holds {figures['attempt_rss_mib']} MiB and "
                f"{figures['headroom_mib']} MiB stay free"
            )
            self.record.event(
                "standby_skipped", sync=True, attempt=attempt, for_attempt=attempt + 1,
                why=self.why_cold, **figures,
            )  # fmt: skip
            return
        self._start(attempt + 1)

    def _start(self, for_attempt: int) -> None:
        command, env = self.launch(for_attempt)
        mine, theirs = socket.socketpair()
        env[ENV_STANDBY_FD] = str(theirs.fileno())
        adir = self.record.attempt_dir(for_attempt)
        child = ChildProcess(
            command, cwd=self.spec.workdir_path, env=env,
            stdout_path=adir / "stdout.log", stderr_path=adir / "stderr.log",
            echo=self.echo, containment=contain(for_attempt), hold=True,
            pass_fds=(theirs.fileno(),),
        )  # fmt: skip
        try:
            child.start()
        except OSError as exc:
            mine.close()
            if child.containment is not None:
                child.containment.close()
            self.why_cold = f"the standby could not start: {exc.strerror or exc}"
            return
        finally:
            theirs.close()  # the child's copy is its own now
        standby = Standby(child, mine, for_attempt, time.monotonic())
        standby.listen()
        self.current = standby
        self.record.event(
            "standby_start", sync=True, attempt=for_attempt - 1, for_attempt=for_attempt,
            pid=child.pid,
        )  # fmt: skip

    def take(self, attempt: int) -> Standby | None:
        """The standby that becomes ``attempt``, or None (:attr:`why_cold` says why)."""
        standby, self.current = self.current, None
        if self.never is not None:
            self.why_cold = self.never
            return None
        if standby is None:
            if attempt - 1 not in self._tried:
                self.why_cold = f"attempt {attempt - 1} ended before its first step"
            return None  # else why_cold says why none was started
        status = standby.child.poll()
        if standby.for_attempt != attempt or status is not None:
            self.why_cold = f"the standby exited (status {status}) before its turn"
            if standby.for_attempt == attempt:
                self.record.event(
                    "standby_lost", sync=True, attempt=attempt - 1, for_attempt=attempt,
                    returncode=status, why=self.why_cold,
                )  # fmt: skip
            self._kill(standby)
            return None
        self.why_cold = None
        return standby

    def go(self, standby: Standby, attempt: int, resume_from: str) -> bool:
        """Tell ``standby`` it is ``attempt``, resuming from ``resume_from``; False if gone."""
        line = json.dumps({"attempt": attempt, "resume_from": resume_from}) + "\n"
        try:
            standby.sock.sendall(line.encode())
        except OSError:
            return False
        finally:
            standby.sock.close()
        return True

    def discard(self) -> None:
        """Kill the standby, if any, with everything it started; it leaves nothing."""
        standby, self.current = self.current, None
        if standby is not None:
            self._kill(standby)

    def _kill(self, standby: Standby) -> None:
        standby.sock.close()  # its end of file: a standby in recv ends by itself
        standby.child.signal_group(signal.SIGKILL)
        standby.child.wait(5.0)
        standby.child.finish()
