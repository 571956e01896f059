"""An attempt's watchdog: stops the attempt's processes if its supervisor dies.

Run by path (``python -I _watchdog.py SUPERVISOR_PID LEADER GRACE_S GROUP_TERM EVENTS
RUN_ID ATTEMPT CGROUP PROCESSES``), not as a module, so that it imports no part of
acceptrun: the standard library and psutil only (so the few lines that read and kill a
cgroup repeat supervisor/containment.py's). Started by
:class:`acceptrun.supervisor.lease.Watchdog`.

The attempt's processes are the leader, its process group, every process whose
environment carries the attempt's ``ACCEPTRUN_RUN_ID`` and ``ACCEPTRUN_ATTEMPT``, and
what its containment holds (supervisor/containment.py): the members of the attempt's
cgroup (CGROUP, "" for none) and the processes listed in PROCESSES
(``attempts/<n>/processes.json``, pid and start time, refreshed by the supervisor while
it lives), which find a process that called setsid and cleared its environment.

Every 0.2 s it checks that its parent is still the supervisor (a dead parent's children
are re-parented at once, even while the dead one is a zombie). It exits quietly when the
attempt's leader is gone and the supervisor is alive (the attempt ended; the supervisor
kills it then anyway). When the supervisor is gone it:

1. appends a ``supervisor_lost`` event to events.jsonl (one line, O_APPEND);
2. sends SIGTERM to the leader (to the group for a string command, whose shell would not
   pass it on): the graceful stop, a second time after the kernel's death signal;
3. waits up to GRACE_S seconds for the leader to exit, then for what is left of them for
   the attempt's other processes (torchrun's ranks checkpointing after their agent died);
4. SIGKILLs the leader's process group, the cgroup (``cgroup.kill``) and every other
   process of the attempt (torchrun's ranks, setsid'd helpers), removes the cgroup, then
   exits. When anything of the attempt was still there at the end of the
   grace period, a ``kill_sent`` event (``by`` = "watchdog") says so first: the stop was
   not graceful, and the record must not leave that to be guessed.

The leader is known by its pid and its start time (read while the supervisor, its
parent, has not reaped it): once it has exited and been reaped, a busy host may give its
pid to another process within seconds, which is then neither waited for nor signalled.
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


def _stat(pid: int) -> tuple[bytes, int] | None:
    """(state, start time) of ``pid`` from /proc/<pid>/stat; None when it cannot be read.

    The start time (clock ticks since boot, field 22) and the pid together name one
    process: a pid is reused once its process is reaped, within seconds on a busy host.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0], int(fields[19])  # fields[0] is field 3
    except (OSError, IndexError, ValueError):
        return None


def _exists(pid: int, started: int | None = None) -> bool:
    """Whether ``pid`` is a live process (not a zombie), the one started at ``started``."""
    found = _stat(pid)
    if found is not None:
        state, start = found
        return state not in (b"Z", b"X") and (started is None or start == started)
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


def _group_ours(pgid: int, started: int | None) -> bool:
    """Whether process group ``pgid`` can still be the leader's own.

    While the leader lives it is. Once it is gone its group lives on in its members, and
    the kernel gives no new process a pid still used as a group id; but when the group
    is gone too, the pid may belong to a new process, whose group it must not touch.
    """
    found = _stat(pgid)
    if found is None:
        return True  # no process has that pid: only our group (if any) holds the number
    return started is None or found[1] == started


def _strays(run_id: str, attempt: str, cgroup: str = "", listed: str = "") -> list[int]:
    """The attempt's live processes other than the leader: marker, cgroup, listed."""
    try:
        import psutil
    except ImportError:
        return []
    me, found = os.getpid(), set()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("ACCEPTRUN_RUN_ID") == run_id and env.get("ACCEPTRUN_ATTEMPT") == attempt:
            found.add(proc.pid)
    candidates = _cgroup_pids(cgroup)
    for pid, started in _listed(listed):
        with contextlib.suppress(psutil.Error, OSError):
            if psutil.Process(pid).create_time() == started:  # not a reused pid
                candidates.append(pid)
    for pid in candidates:
        with contextlib.suppress(psutil.Error, OSError):
            if pid != me and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.add(pid)
    return sorted(found)


def _cgroup_pids(cgroup: str) -> list[int]:
    if not cgroup:
        return []
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def _listed(path: str) -> list[tuple[int, float]]:
    """The processes the supervisor listed in processes.json (a torn file: none)."""
    if not path:
        return []
    try:
        with open(path) as f:
            rows = json.load(f).get("processes", [])
        return [(int(r["pid"]), float(r["started"])) for r in rows]
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return []


def _kill_cgroup(cgroup: str) -> None:
    if not cgroup:
        return
    try:
        with open(os.path.join(cgroup, "cgroup.kill"), "w") as f:
            f.write("1")
    except OSError:  # before Linux 5.14: each member is killed by pid instead
        for pid in _cgroup_pids(cgroup):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _remove_cgroup(cgroup: str) -> None:
    """rmdir the emptied cgroup (its members take a moment to be gone)."""
    if not cgroup:
        return
    for _ in range(50):
        try:
            os.rmdir(cgroup)
            return
        except FileNotFoundError:
            return
        except OSError:
            _kill_cgroup(cgroup)
            time.sleep(POLL_S / 2)


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
    cgroup, listed = (argv[7], argv[8]) if len(argv) > 8 else ("", "")
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)  # only the supervisor (SIGKILL) ends a watchdog
    # The leader is the supervisor's child, not reaped before this reads it: its pid is
    # still its own. Once the supervisor is gone, another process may be given that pid
    # (the leader reaped by init): it is signalled and waited for only while it is this one.
    stat = _stat(leader)
    started = stat[1] if stat is not None else None
    while os.getppid() == supervisor:
        if not _exists(leader, started) and not _group_alive(leader):
            return 0  # the attempt ended while the supervisor lives: nothing to guard
        time.sleep(POLL_S)
    lost_at = time.time()
    _event(
        events, "supervisor_lost", attempt=int(attempt), by="watchdog",
        supervisor_pid=supervisor, grace_s=grace,
    )  # fmt: skip
    try:
        if group_term and _group_ours(leader, started):
            os.killpg(leader, signal.SIGTERM)
        elif _exists(leader, started):
            os.kill(leader, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    while time.time() - lost_at < grace and _exists(leader, started):
        time.sleep(POLL_S)
    # The leader may end first while the rest still checkpoints: torchrun's agent dies of
    # repeated SIGTERMs, or of SIGPIPE when it writes to the dead supervisor's pipe (then
    # before it passed the stop on), and its ranks live on, each in a session of its own.
    # Each process of the attempt still running is told the stop itself, once, and they
    # get what is left of the grace period too.
    told: set[int] = set()
    while time.time() - lost_at < grace and (left := _strays(run_id, attempt, cgroup, listed)):
        new = sorted(set(left) - told)
        if new:  # recorded first, as the supervisor does: a reader that sees them gone
            told.update(new)  # finds why
            _event(
                events, "stop_sent", attempt=int(attempt), by="watchdog", signal="SIGTERM",
                after_s=round(time.time() - lost_at, 3), pids=new,
                reason="the supervisor was gone and the attempt's leader had ended: each "
                "process of the attempt still running is asked to stop itself",
            )  # fmt: skip
        for pid in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        time.sleep(STRAY_POLL_S)
    # The leader has exited (checkpointed) or overstayed its grace: nothing of the attempt
    # may stay behind. A second sweep catches a process forked during the first.
    left = ([leader] if _exists(leader, started) else []) + _strays(run_id, attempt, cgroup, listed)
    if left:
        _event(
            events, "kill_sent", attempt=int(attempt), by="watchdog", signal="SIGKILL",
            after_s=round(time.time() - lost_at, 3), pids=sorted(set(left)),
            reason=f"the supervisor was gone and the grace period ({grace:g} s) ran out: "
            f"processes {sorted(set(left))} still running",
        )  # fmt: skip
    for _ in range(2):
        if _group_ours(leader, started):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(leader, signal.SIGKILL)
        _kill_cgroup(cgroup)
        for pid in _strays(run_id, attempt, cgroup, listed):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(POLL_S)
    _remove_cgroup(cgroup)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
