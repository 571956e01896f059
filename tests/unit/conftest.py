"""The unit tier's guard: a unit test that starts a process fails.

Unit tests run in milliseconds and never wait on a child; a test that needs a real child
process (a workload, a server, a CLI run) belongs in tests/integration. The guard watches
the interpreter's audit events for every way Python starts a process (subprocess, fork,
posix_spawn, exec, system) and multiprocessing's direct fork_exec, raises at the call, and
fails the test at teardown too in case the code under test swallowed the error.
"""

from __future__ import annotations

import _posixsubprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

_SPAWN_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.exec",
        "os.system",
    }
)
MOVE_HINT = "a unit test may not start a process: move it to tests/integration"


@dataclass
class _Guard:
    active: bool = False
    started: list[str] = field(default_factory=list)


_guard = _Guard()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _guard.active and event in _SPAWN_EVENTS:
        _guard.started.append(event)
        raise RuntimeError(f"{event}{args[:2]!r}: {MOVE_HINT}")


sys.addaudithook(_audit)  # audit hooks cannot be removed; the flag turns it on per test


@pytest.fixture(autouse=True)
def no_child_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    real_fork_exec = _posixsubprocess.fork_exec

    def fork_exec(*args: Any, **kwargs: Any) -> Any:
        # multiprocessing's spawn and forkserver start children through fork_exec without
        # an audit event of their own.
        if _guard.active:
            _guard.started.append("_posixsubprocess.fork_exec")
            raise RuntimeError(f"_posixsubprocess.fork_exec: {MOVE_HINT}")
        return real_fork_exec(*args, **kwargs)

    monkeypatch.setattr(_posixsubprocess, "fork_exec", fork_exec)
    _guard.started.clear()
    _guard.active = True
    try:
        yield
    finally:
        _guard.active = False
    if _guard.started:
        pytest.fail(f"started a process ({', '.join(_guard.started)}): {MOVE_HINT}")
