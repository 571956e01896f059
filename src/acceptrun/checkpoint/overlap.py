"""A save's copy left to its background thread, and the one hook that makes steps wait.

An overlapped save (``[checkpoint] staging = "overlap"``, ``sharded.async_save(overlap=)``)
copies in the call only what a forward may change; the parameters and optimizer state,
which change only in an optimizer's ``step()``, are copied by the save's background
thread beside the next forward and backward. :class:`Overlap` is that copy's one
mechanism, for every saver:

- :meth:`Overlap.arm` (the training thread, in the save call) registers it; one global
  torch.optim step pre-hook, registered once per process, makes any optimizer's
  ``step()`` wait for every armed copy (:meth:`Overlap.wait`);
- :meth:`Overlap.run` (the background thread) runs the copy, is done (and disarmed)
  whether it failed or not, and sends the save's ``checkpoint_stage`` event: ``stall_s``
  is all the save blocked the loop (the call, plus the wait of a step that came before
  the copy was done), ``copy_s`` the copy, ``waited_s`` that wait, ``overlapped`` true.

What the copy checks (tensor version counters) is the saver's: the copy callable raises.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

__all__ = ["Overlap"]

EventSink = Callable[[str, dict[str, Any]], None]


class Overlap:
    """One save's deferred copy: any torch.optim optimizer's step waits for it once armed."""

    _armed: ClassVar[set[Overlap]] = set()
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _hook: ClassVar[Any] = None  # the global step pre-hook, registered once per process

    def __init__(self, step: int, call_s: float, nbytes: int, on_event: EventSink) -> None:
        self.step, self.call_s, self.nbytes = step, call_s, nbytes
        self.on_event = on_event
        self.done = threading.Event()
        self.wait_from: float | None = None  # when a step began to wait for it

    def arm(self) -> None:
        """From now until :meth:`run` ends, every optimizer step waits for this copy."""
        with Overlap._lock:
            Overlap._armed.add(self)
            if Overlap._hook is None:
                from torch.optim.optimizer import register_optimizer_step_pre_hook

                Overlap._hook = register_optimizer_step_pre_hook(Overlap._before_step)

    @staticmethod
    def _before_step(*_args: Any) -> None:
        with Overlap._lock:
            armed = list(Overlap._armed)
        for overlap in armed:
            overlap.wait()

    def wait(self) -> None:
        """Block until the copy is done (failed or not)."""
        if not self.done.is_set():
            self.wait_from = time.perf_counter()
            self.done.wait()

    def run(self, copy: Callable[[], object]) -> float:
        """Run ``copy`` (the background thread); its exception propagates, with the copy
        done and disarmed. Returns ``waited_s``, after sending the stage event."""
        t0 = time.perf_counter()
        try:
            copy()
        finally:
            finished = time.perf_counter()
            self.done.set()
            with Overlap._lock:
                Overlap._armed.discard(self)
        started = self.wait_from  # read after done: a step that waited set it before
        waited = max(0.0, finished - started) if started is not None else 0.0
        self.on_event(
            "checkpoint_stage",
            {
                "step": self.step, "stall_s": round(self.call_s + waited, 6),
                "bytes": self.nbytes, "overlapped": True, "copy_s": round(finished - t0, 6),
                "waited_s": round(waited, 6),
            },
        )  # fmt: skip
        return waited
