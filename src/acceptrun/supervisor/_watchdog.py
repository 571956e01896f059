"""An attempt's watchdog: stops the attempt's processes if its supervisor dies.

Run by path (``python -I _watchdog.py SUPERVISOR_PID LEADER GRACE_S GROUP_TERM EVENTS
RUN_ID ATTEMPT``), not as a module, so that it imports no part of acceptrun: the standard
library and psutil only. Started by :class:`acceptrun.supervisor.lease.Watchdog`.

Every 0.2 s it checks that its parent is still the supervisor (a dead parent's children
are re-parented at once, even while the dead one is a zombie). It exits quietly when the
attempt's leader is gone and the supervisor is alive (the attempt ended; the supervisor
kills it then anyway). When the supervisor is gone it:

1. appends a ``supervisor_lost`` event to events.jsonl (one line, O_APPEND);
2. sends SIGTERM to the leader (to the group for a string command, whose shell would not
   pass it on): the graceful stop, a second time after the kernel's death signal;
3. waits up to GRACE_S seconds for the leader to exit, then for what is left of them for
   the attempt's other processes (torchrun's ranks checkpointing after their agent died);
4. SIGKILLs the leader's process group and every process whose environment carries this
   attempt's ``ACCEPTRUN_RUN_ID`` and ``ACCEPTRUN_ATTEMPT`` (torchrun's ranks, setsid'd
   helpers), then exits. When anything of the attempt was still there at the end of the
   grace period, a ``kill_sent`` event (``by`` = "watchdog") says so first: the stop was
   not graceful, and the record must not leave that to be guessed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time

POLL_S = 0.2  # seconds between looks at the parent pid and the leader
STRAY_POLL_S = 0.5  # seconds between sweeps of every process's environment (costlier)


def _exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not os.path.isdir("/proc")  # /proc said it is gone where there is one


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _strays(run_id: str, attempt: str) -> list[int]:
    try:
        import psutil
    except ImportError:
        return []
    me, found = os.getpid(), []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("ACCEPTRUN_RUN_ID") == run_id and env.get("ACCEPTRUN_ATTEMPT") == attempt:
            found.append(proc.pid)
    return found


def _event(path: str, kind: str, **fields: object) -> None:
    line = json.dumps({"t": round(time.time(), 6), "kind": kind, **fields}) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        print(
            f"acceptrun watchdog: could not record {kind} in {path}: {exc}",
            file=sys.stderr,
        )


def main(argv: list[str]) -> int:
    supervisor, leader = int(argv[0]), int(argv[1])
    grace, group_term = float(argv[2]), argv[3] == "1"
    events, run_id, attempt = argv[4], argv[5], argv[6]
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)  # only the supervisor (SIGKILL) ends a watchdog
    while os.getppid() == supervisor:
        if not _exists(leader) and not _group_alive(leader):
            return 0  # the attempt ended while the supervisor lives: nothing to guard
        time.sleep(POLL_S)
    lost_at = time.time()
    _event(
        events, "supervisor_lost", attempt=int(attempt), by="watchdog",
        supervisor_pid=supervisor, grace_s=grace,
    )  # fmt: skip
    try:
        if group_term:
            os.killpg(leader, signal.SIGTERM)
        else:
            os.kill(leader, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    while time.time() - lost_at < grace and _exists(leader):
        time.sleep(POLL_S)
    # The leader may end first while the rest still checkpoints: torchrun's agent dies of
    # repeated SIGTERMs and its ranks (each in a session of its own) stop on the death
    # signal it leaves them. They get what is left of the grace period too.
    while time.time() - lost_at < grace and _strays(run_id, attempt):
        time.sleep(STRAY_POLL_S)
    # The leader has exited (checkpointed) or overstayed its grace: nothing of the attempt
    # may stay behind. A second sweep catches a process forked during the first.
    left = ([leader] if _exists(leader) else []) + _strays(run_id, attempt)
    if left:
        _event(
            events, "kill_sent", attempt=int(attempt), by="watchdog", signal="SIGKILL",
            after_s=round(time.time() - lost_at, 3),
            reason=f"the supervisor was gone and the grace period ({grace:g} s) ran out: "
            f"processes {sorted(set(left))} still running",
        )  # fmt: skip
    for _ in range(2):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGKILL)
        for pid in _strays(run_id, attempt):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
