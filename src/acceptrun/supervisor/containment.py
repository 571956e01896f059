"""What holds an attempt's processes together, so that none can leave and outlive it.

A process group is not enough: any program may call ``setsid()`` (torchrun's ranks, a
daemon that double-forks, ``setsid env -i ...``) and an environment marker is not either:
``env -i`` clears it. One of these holds the attempt instead, the best the system allows:

``cgroup``
    a cgroup v2 child of the supervisor's own cgroup, made per attempt; the child is
    moved into it between fork and exec, so everything it starts is born inside and no
    call can leave it (only a privileged write to another cgroup's ``cgroup.procs``).
    ``cgroup.kill`` (Linux 5.14+) kills all of it at once; the watchdog does the same
    after the supervisor's death. The cgroup has no controllers of its own: memory is
    still charged to (and OOM kills counted in) the supervisor's cgroup.
``subreaper``
    ``prctl(PR_SET_CHILD_SUBREAPER)`` on the supervisor: a process whose parent dies is
    re-parented to the supervisor instead of init, so it stays in the supervisor's tree.
    The supervisor lists the attempt's processes (pid and start time) each second in
    ``attempts/<n>/processes.json``; the watchdog and ``acceptrun resume`` read that list,
    since after the supervisor's death its orphans belong to init.
``none``
    neither is available (not Linux): only the process group and the environment marker
    find the attempt's processes, which the attempt's ``containment`` event says loudly.

``ACCEPTRUN_CONTAINMENT`` (``auto``, the default, or ``cgroup``, ``subreaper``, ``none``)
forces a mechanism, for tests and for a host where a cgroup is not wanted; a forced
mechanism the system cannot give falls back as ``auto`` would, and says so.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_CONTAINMENT",
    "MECHANISMS",
    "PROCESSES_FILE",
    "Containment",
    "contain",
    "listed_pids",
    "supported",
]

ENV_CONTAINMENT = "ACCEPTRUN_CONTAINMENT"
MECHANISMS = ("cgroup", "subreaper", "none")  # best first
PROCESSES_FILE = "processes.json"  # attempts/<n>/processes.json: {"cgroup", "processes"}
_PR_SET_CHILD_SUBREAPER = 36  # prctl(2) option, linux/prctl.h
_subreaper_set = False  # the flag is per process: set it once


def cgroup2_dir() -> Path | None:
    """The directory of this process's cgroup v2, where one is mounted; None elsewhere.

    ``/proc/self/cgroup`` names it (``0::/path``); ``/proc/self/mountinfo`` says where the
    v2 hierarchy is mounted (``/sys/fs/cgroup``, or ``/sys/fs/cgroup/unified`` on a hybrid
    host) and from which root (a container often mounts only its own cgroup).
    """
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    paths = [line[3:] for line in lines if line.startswith("0::")]
    if not paths:
        return None
    cgpath = paths[0]
    for mount in mounts:
        fields_, _, tail = mount.partition(" - ")
        parts, fs = fields_.split(), tail.split()
        if len(parts) < 5 or not fs or fs[0] != "cgroup2":
            continue
        root, point = parts[3].replace("\\040", " "), parts[4].replace("\\040", " ")
        if cgpath != root and not cgpath.startswith(root.rstrip("/") + "/"):
            continue
        path = Path(point, cgpath[len(root) :].lstrip("/"))
        if (path / "cgroup.procs").exists():
            return path
    return None


def _set_subreaper() -> str | None:
    """Make this process its descendants' subreaper; None when done, else why not."""
    global _subreaper_set
    if _subreaper_set:
        return None
    if not sys.platform.startswith("linux"):
        return "the child-subreaper flag needs Linux"
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError) as exc:
        return f"prctl is not available: {exc}"
    if prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}"
    _subreaper_set = True
    return None


def _make_cgroup(attempt: int) -> tuple[Path | None, str | None]:
    """A new child cgroup for the attempt, or None and why not."""
    if not sys.platform.startswith("linux"):
        return None, "cgroups need Linux"
    parent = cgroup2_dir()
    if parent is None:
        return None, "no cgroup v2 hierarchy is mounted for this process"
    path = parent / f"acceptrun-{os.getpid()}-{attempt}-{secrets.token_hex(3)}"
    try:
        path.mkdir()
    except OSError as exc:
        return None, f"cannot create a cgroup under {parent}: {exc.strerror or exc}"
    if not os.access(path / "cgroup.procs", os.W_OK):
        with contextlib.suppress(OSError):
            path.rmdir()
        return None, f"{path / 'cgroup.procs'} is not writable"
    return path, None


def supported() -> list[str]:
    """The mechanisms this system gives (the cgroup one is tried for real, then removed)."""
    found = []
    path, _ = _make_cgroup(0)
    if path is not None:
        found.append("cgroup")
        with contextlib.suppress(OSError):
            path.rmdir()
    if sys.platform.startswith("linux"):
        found.append("subreaper")
    found.append("none")
    return found


def _start_time(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


@dataclass
class Containment:
    """An attempt's processes, held by ``mechanism``; ``why`` says why not a better one."""

    mechanism: str
    attempt: int
    cgroup: Path | None = None
    why: str = ""
    exclude: set[int] = field(default_factory=set)  # the supervisor's own helpers (watchdog)
    tracked: dict[int, float] = field(default_factory=dict)  # pid -> start time, ever seen
    leader: int | None = None
    leader_started: float | None = None
    _procs_fd: int | None = None

    # ---- the fork -----------------------------------------------------------------------------

    def before_fork(self) -> int | None:
        """The fd the child writes "0" to, between fork and exec, to enter the cgroup."""
        if self.cgroup is None:
            return None
        self._procs_fd = os.open(self.cgroup / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        return self._procs_fd

    def after_fork(self, leader: int | None) -> None:
        """The parent's side: close the fd, note the leader (None: the start failed)."""
        if self._procs_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._procs_fd)
            self._procs_fd = None
        if leader is not None:
            self.leader = leader
            self.leader_started = _start_time(leader)

    def degrade(self, why: str) -> None:
        """The cgroup could not take the child: the subreaper holds the attempt instead."""
        self.close()
        self.cgroup = None
        reason = _set_subreaper()
        self.mechanism = "subreaper" if reason is None else "none"
        self.why = why if reason is None else f"{why}; {reason}"

    # ---- what belongs to the attempt ----------------------------------------------------------

    def pids(self) -> dict[int, float]:
        """The attempt's live processes now: pid -> start time (psutil's ``create_time``)."""
        import psutil

        found: dict[int, float] = {}

        def add(proc: Any) -> None:
            with contextlib.suppress(psutil.Error, OSError):
                if proc.pid not in self.exclude and proc.status() != psutil.STATUS_ZOMBIE:
                    found[proc.pid] = float(proc.create_time())

        if self.cgroup is not None:
            for pid in _cgroup_pids(self.cgroup):
                with contextlib.suppress(psutil.Error, OSError):
                    add(psutil.Process(pid))
            return found
        roots: list[Any] = []
        if self.leader is not None:
            with contextlib.suppress(psutil.Error, OSError):
                leader = psutil.Process(self.leader)
                if leader.create_time() == self.leader_started:
                    roots.append(leader)
        roots += self._orphans()
        for root in roots:
            add(root)
            with contextlib.suppress(psutil.Error, OSError):
                for proc in root.children(recursive=True):
                    add(proc)
        for pid, started in list(self.tracked.items()):  # seen before, re-parented to init
            if pid not in found and _start_time(pid) == started:
                with contextlib.suppress(psutil.Error, OSError):
                    add(psutil.Process(pid))
        return found

    def _orphans(self) -> list[Any]:
        """The attempt's processes re-parented to the supervisor (the subreaper).

        Its children that started after the leader, in a session other than the
        supervisor's, and are not its own helpers: the leader and everything it starts run
        in the leader's session (or one they made), the supervisor's own short commands in
        the supervisor's.
        """
        import psutil

        if self.mechanism != "subreaper" or self.leader_started is None:
            return []
        me, out = os.getpid(), []
        mine = os.getsid(0)
        with contextlib.suppress(psutil.Error, OSError):
            for proc in psutil.Process(me).children():
                with contextlib.suppress(psutil.Error, OSError):
                    if proc.pid in self.exclude or proc.pid == self.leader:
                        continue
                    if proc.create_time() < self.leader_started or os.getsid(proc.pid) == mine:
                        continue
                    out.append(proc)
        return out

    def refresh(self) -> bool:
        """Add the processes alive now to :attr:`tracked`; True when a new one was seen."""
        now = self.pids()
        new = {p: t for p, t in now.items() if self.tracked.get(p) != t}
        self.tracked.update(new)
        return bool(new)

    def to_record(self) -> dict[str, Any]:
        """``attempts/<n>/processes.json``: what the watchdog and ``resume`` read."""
        return {
            "mechanism": self.mechanism,
            "cgroup": None if self.cgroup is None else str(self.cgroup),
            "processes": [{"pid": p, "started": t} for p, t in sorted(self.tracked.items())],
        }

    def describe(self) -> dict[str, Any]:
        """The attempt_start event's ``containment`` field."""
        out: dict[str, Any] = {"mechanism": self.mechanism}
        if self.cgroup is not None:
            out["cgroup"] = str(self.cgroup)
        if self.why:
            out["why"] = self.why
        return out

    # ---- the end ------------------------------------------------------------------------------

    def kill(self) -> list[int]:
        """SIGKILL every process of the attempt still alive; their pids."""
        killed: set[int] = set()
        for _ in range(3):  # a process forked during a sweep is caught by the next one
            alive = self.pids()
            self.tracked.update(alive)
            if not alive:
                break
            if self.cgroup is not None and _cgroup_kill(self.cgroup):
                killed.update(alive)
                continue
            for pid in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
        self._reap(killed)
        return sorted(killed)

    def _reap(self, pids: Iterable[int]) -> None:
        """Collect killed orphans the subreaper inherited (they would stay zombies)."""
        if self.mechanism != "subreaper":
            return
        deadline = time.monotonic() + 2.0
        pending = {p for p in pids if p != self.leader}  # Popen waits for the leader
        while pending and time.monotonic() < deadline:
            for pid in list(pending):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # not (or no longer) the supervisor's child
                    pending.discard(pid)
                    continue
                if done:
                    pending.discard(pid)
            if pending:
                time.sleep(0.02)

    def close(self) -> None:
        """Remove the attempt's cgroup once it is empty (a few seconds at most)."""
        if self.cgroup is None:
            return
        deadline = time.monotonic() + 5.0
        while True:
            try:
                self.cgroup.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    print(
                        f"acceptrun: could not remove the attempt's cgroup {self.cgroup}: "
                        f"{exc.strerror or exc}",
                        file=sys.stderr,
                    )
                    return
                _cgroup_kill(self.cgroup)
                time.sleep(0.05)


def _ours(path: Path) -> bool:
    """A cgroup directory this module made: ``acceptrun-...``, a child of another cgroup."""
    if not path.is_absolute() or ".." in path.parts or not path.name.startswith("acceptrun-"):
        return False
    return (path / "cgroup.procs").is_file() and (path.parent / "cgroup.procs").is_file()


def _cgroup_pids(path: Path) -> list[int]:
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _cgroup_kill(path: Path) -> bool:
    """Write cgroup.kill (Linux 5.14+); False where the kernel has none."""
    try:
        with open(path / "cgroup.kill", "w") as f:
            f.write("1")
    except OSError:
        return False
    return True


def listed_pids(held: Any) -> list[int]:
    """Live processes a ``processes.json`` names: its cgroup's members, its listed pids.

    A listed pid counts only while its start time matches (the pid was not reused).
    Anything malformed in the file lists nothing.
    """
    if not isinstance(held, dict):
        return []
    found: set[int] = set()
    cgroup = held.get("cgroup")
    # Only a cgroup acceptrun made: a record that named another one (the root) must not
    # make `resume` kill what is in it.
    if isinstance(cgroup, str) and _ours(Path(cgroup)):
        found.update(_cgroup_pids(Path(cgroup)))
    for row in held.get("processes") or []:
        with contextlib.suppress(TypeError, ValueError, KeyError, AttributeError):
            pid, started = int(row["pid"]), float(row["started"])
            if _start_time(pid) == started:
                found.add(pid)
    return sorted(p for p in found if p != os.getpid())


def contain(attempt: int, *, forced: str | None = None) -> Containment:
    """The best mechanism for a new attempt (``forced``, else ``$ACCEPTRUN_CONTAINMENT``)."""
    want = (forced or os.environ.get(ENV_CONTAINMENT) or "auto").strip().lower()
    notes: list[str] = []
    if want not in ("auto", *MECHANISMS):
        notes.append(f"{ENV_CONTAINMENT}={want!r} is not one of auto, {', '.join(MECHANISMS)}")
        want = "auto"
    if want == "none":
        return Containment("none", attempt, why=f"{ENV_CONTAINMENT}=none")
    if want in ("auto", "cgroup"):
        path, why = _make_cgroup(attempt)
        if path is not None:
            return Containment("cgroup", attempt, cgroup=path, why="; ".join(notes))
        notes.append(str(why))
    elif want == "subreaper":
        notes.append(f"{ENV_CONTAINMENT}=subreaper")
    reason = _set_subreaper()
    if reason is None:
        return Containment("subreaper", attempt, why="; ".join(notes))
    notes.append(reason)
    return Containment("none", attempt, why="; ".join(notes))
