"""A standby attempt's side: the script runs up to ``run.restore()``, then waits its turn.

With ``limits.warm_restart`` the supervisor starts the next attempt while one runs
(supervisor/standby.py), with :data:`ENV_STANDBY_FD` naming its end of a socket pair.
:func:`~acceptrun.run.standalone.init` then attaches nothing: no ``workload_start``, no
heartbeat, no SIGTERM handler, no attempt folder; what it would do is held
(:func:`hold`) and every event the run would write waits for the go. ``run.restore()``
and ``run.steps()`` call :func:`wait_for_go` first: the standby says ``ready`` and
blocks in one ``recv`` until the supervisor writes its go, one JSON line
``{"attempt": n, "resume_from": path}``. It takes those as its attempt's (the
environment too), attaches, and restores the newest state as any attempt does.

An end of file instead (the attempt before it finished, or the supervisor is gone) ends
the process at once with ``os._exit``: no exit hook runs, nothing reaches the record.

On a GPU nothing here touches the device; torch creates its CUDA context lazily, so a
standby holds GPU memory only when the script's own code before ``run.restore()`` moves
something to the device. The go says so in the record (``standby_gpu``), as a warning:
move the model after ``run.restore()`` (``map_location`` restores onto the CPU).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

from acceptrun.workload.contract import ENV_ATTEMPT, ENV_RESUME_FROM

__all__ = ["ENV_STANDBY_FD", "READY", "hold", "wait_for_go"]

ENV_STANDBY_FD = "ACCEPTRUN_STANDBY_FD"  # the standby's end of its socket pair
READY = b"ready\n"  # the standby reached run.restore() (or run.steps())

_held: tuple[Any, Callable[[], None]] | None = None  # (the run, the rest of its init)


class _HeldRecord:
    """The run's record while it is a standby: an event waits for the go, then is written."""

    def __init__(self, run: Any, record: Any) -> None:
        self._run = run
        self._record = record

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        wait_for_go(self._run)
        fields["attempt"] = self._run.attempt  # the attempt it became, not the one guessed
        return self._record.event(kind, **fields)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._record, name)


def hold(run: Any, attach: Callable[[], None]) -> bool:
    """In a standby, keep ``attach`` (the rest of init) for the go and return True."""
    global _held
    if not os.environ.get(ENV_STANDBY_FD):
        return False
    _held = (run, attach)
    run.record = _HeldRecord(run, run.record)
    return True


def wait_for_go(run: Any) -> None:
    """A standby waits here for its turn, then attaches; at once for any other process.

    Costs one global read when the process is no standby (every ``run.steps()``).
    """
    global _held
    if _held is None or _held[0] is not run:
        return
    attach = _held[1]
    _held = None
    go = _receive_go(int(os.environ.pop(ENV_STANDBY_FD)))
    run.record = run.record._record
    run.attempt = int(go["attempt"])
    run.resume_from = go.get("resume_from") or None
    os.environ[ENV_ATTEMPT] = str(run.attempt)
    os.environ[ENV_RESUME_FROM] = run.resume_from or ""
    attach()
    if _gpu_in_use():
        run.record.event(
            "standby_gpu", sync=True, attempt=run.attempt, for_attempt=run.attempt,
            why="the script's code before run.restore() created a CUDA context while the "
            "attempt before it ran: move the model to the GPU after run.restore()",
        )  # fmt: skip


def _receive_go(fd: int) -> dict[str, Any]:
    """Say ready, then block until the go line; an end of file ends the process."""
    with socket.socket(fileno=fd) as sock:
        with contextlib.suppress(OSError):  # the go may be here already, the peer closed
            sock.sendall(READY)
        try:
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
        except OSError:
            data = b""
    if not data.endswith(b"\n"):
        os._exit(0)  # discarded: leave nothing behind, run no exit hook
    go = json.loads(data)
    if not isinstance(go, dict) or not isinstance(go.get("attempt"), int):
        os._exit(2)  # not the supervisor's go: never run as an attempt of unknown number
    return go


def _gpu_in_use() -> bool:
    """Whether torch already holds a CUDA context (only ever read, never created here)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_initialized())
    except Exception:  # a broken torch install must not fail the attempt
        return False
