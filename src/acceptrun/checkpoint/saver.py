"""Asynchronous checkpoint saves: stage on the training thread, persist in the background.

The training loop is blocked only while :func:`~acceptrun.checkpoint.state.stage` copies
the state into host memory (into reused buffers, pinned for CUDA tensors). A background
thread then writes the safetensors and JSON files through the store (hashing as it
writes), commits the manifest and LATEST, applies retention, and hands the checkpoint to
the mirror. The next save, or the end of the run, waits for it; a failure is recorded as
an event at once and raised on the next call, never swallowed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from acceptrun.checkpoint.mirror import Mirror
from acceptrun.checkpoint.state import Staged, StagingBuffers, stage, write_staged
from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore
from acceptrun.errors import AcceptrunError

__all__ = ["CheckpointError", "Checkpointer"]

EventSink = Callable[[str, dict[str, Any]], None]


class CheckpointError(AcceptrunError):
    """A background checkpoint save failed; the previous checkpoint is intact."""


class Checkpointer:
    """One run's saves: at most one in flight, its failure surfaced on the next call."""

    def __init__(
        self,
        store: CheckpointStore,
        *,
        mirror: Mirror | None = None,
        on_event: EventSink | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.mirror = mirror
        self.on_event = on_event or (lambda _kind, _fields: None)
        self.meta = dict(meta or {})
        self.last_committed: CheckpointInfo | None = None
        self._buffers = StagingBuffers()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._error_step: int | None = None

    def save(
        self,
        step: int,
        objects: Mapping[str, Any],
        *,
        metrics: Mapping[str, float] | None = None,
        block: bool = False,
    ) -> float:
        """Snapshot ``objects`` as the state after ``step``; returns the stall in seconds.

        Blocks the training loop for the previous save to finish (normally long done)
        plus the host copy of the state. ``block=True`` also waits for the commit (used
        before exiting on a stop request).
        """
        self.wait()
        t0 = time.perf_counter()
        staged = stage(objects, buffers=self._buffers)
        stall = time.perf_counter() - t0
        self.on_event(
            "checkpoint_stage", {"step": step, "stall_s": round(stall, 6), "bytes": staged.nbytes}
        )
        self._thread = threading.Thread(
            target=self._persist,
            args=(step, staged, dict(metrics or {})),
            name=f"acceptrun-save-{step}",
            daemon=True,
        )
        self._thread.start()
        if block:
            self.wait()
        return stall

    def _persist(self, step: int, staged: Staged, metrics: dict[str, float]) -> None:
        writer = None
        try:
            writer = self.store.begin(step)
            write_staged(staged, writer)
            info = self.store.commit(writer, metrics=metrics, meta=self.meta)
            self.last_committed = info
            if self.mirror is not None:
                self.mirror.enqueue(info.step, info.path)
        except BaseException as exc:  # recorded now, raised on the next call
            staged.release()
            if writer is not None and writer.state == "open":
                self.store.abort(writer)
            self._error, self._error_step = exc, step
            self.on_event(
                "checkpoint_failed", {"step": step, "error": f"{type(exc).__name__}: {exc}"}
            )

    def wait(self) -> CheckpointInfo | None:
        """Wait for the save in flight; raise CheckpointError if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            exc, step = self._error, self._error_step
            self._error = self._error_step = None
            raise CheckpointError(
                f"the checkpoint of step {step} was not saved ({type(exc).__name__}: {exc}); "
                "the previous checkpoint is intact. Fix the cause (disk space, permissions) "
                "and the next save will retry."
            ) from exc
        return self.last_committed

    def close(self, *, mirror_timeout: float | None = 60.0) -> None:
        """Wait for the last save, then give the mirror up to ``mirror_timeout`` s to catch up."""
        try:
            self.wait()
        finally:
            if self.mirror is not None:
                if not self.mirror.wait(mirror_timeout):
                    self.on_event(
                        "mirror_behind",
                        {"status": {str(k): v for k, v in self.mirror.status().items()}},
                    )
                self.mirror.close(timeout=5)
