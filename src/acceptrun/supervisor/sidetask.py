"""A task beside each attempt's process: started, polled and settled by the supervisor.

A serving run's load test is one (:class:`acceptrun.serving.driver.ServingDriver`): the
run layer (run/launch.py, run/lifecycle.py) hands the supervisor the way to start one per
attempt, so the supervisor never imports serving. The attempt ends when the task has
``finished`` (a stop cause, supervisor/stops.py), the task names how the attempt ended
(``settle``), and it is told when the process exits before it is done.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from acceptrun.supervisor.outcome import AttemptResult

__all__ = ["SideTask", "StartSideTask"]


class SideTask(Protocol):
    finished: threading.Event  # set when the task is done: the attempt may end
    stop_reason: str  # why, once finished

    def start(self) -> None: ...

    def settle(self, res: AttemptResult, returncode: int) -> None:
        """Name how the attempt ended (``res`` changed in place)."""

    def server_exited(self) -> None:
        """The attempt's process ended: stop, keep what was measured."""

    def join(self, timeout: float | None = None) -> None: ...


class StartSideTask(Protocol):
    """Makes the side task of attempt ``attempt`` (the supervisor starts it)."""

    def __call__(
        self, attempt: int, *, launched_at: float, logs: tuple[Path, Path], pid: int | None
    ) -> SideTask: ...
