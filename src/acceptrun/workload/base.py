"""The state a :class:`~acceptrun.workload.run.Run` shares across its parts.

:class:`RunBase` holds what every part of the client reads (the record, the attempt, the
rank, the spec) and the helpers they share. The parts are mixins over it, one concern
each: :mod:`~acceptrun.workload.loop` (steps, step events, timings),
:mod:`~acceptrun.workload.signals` (stop requests), :mod:`~acceptrun.workload.checkpointing`
(restore, checkpoint, drills) and :mod:`~acceptrun.workload.watch` (heartbeats, stacks,
divergence, injected faults); :class:`~acceptrun.workload.run.Run` combines them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acceptrun.record.workspace import RunRecord
from acceptrun.workload.contract import ENV_CHECKPOINT_DIR, ENV_DRILL, ENV_RESUME_FROM, ENV_SPEC

__all__ = ["RunBase"]


class RunBase:
    """What the run's parts share: the record, the attempt, ranks, the spec and the loop's state."""

    def __init__(
        self,
        record: RunRecord,
        *,
        attempt: int,
        supervised: bool,
        on_finish: Callable[[str], None] | None = None,
    ) -> None:
        self.record = record
        self.run_id = record.run_id
        self.run_dir = record.path
        self.attempt = attempt
        self.supervised = supervised
        self.on_finish = on_finish  # called by finish() with the status, after workload_end
        self.resume_from: str | None = os.environ.get(ENV_RESUME_FROM) or None
        self.checkpoint_dir = Path(os.environ.get(ENV_CHECKPOINT_DIR) or record.checkpoints_dir)
        self.finished = False
        self._pid = os.getpid()  # a forked child (a data-loader worker) has another
        self._stop_requested = False
        self._in_steps = False
        self._pending: dict[str, Any] = {}
        self._data_wait = 0.0  # seconds waited for data in the current step
        self._last_log: float | None = None
        self._exception: BaseException | None = None
        self.drill = os.environ.get(ENV_DRILL) or None
        self._objects: dict[str, Any] = {}
        self._checkpointer: Any = None  # checkpoint.saver.Checkpointer, created on first use
        self._mirror: Any = None  # checkpoint.mirror.Mirror of checkpoint.mirror (rank 0)
        # _close_checkpoints_once: at the interpreter's exit hook (signals.py), or in finish.
        self._checkpoints_closed = False
        self._checkpoints_error: str | None = None
        self._last_values: dict[str, float] = {}
        self._last_values_step: int | None = None  # the step _last_values were logged for
        self._last_saved_step: int | None = None
        self._last_save_time = time.monotonic()
        self._restored: dict[str, Any] | None = None
        self._values: dict[str, Any] = {}  # plain values the last restore gave back
        self._spec: Any = None
        # What the loop is doing, for the heartbeat thread: (phase, step, since unix s).
        self._phase: tuple[str, int | None, float] = ("startup", None, time.time())
        self._faults: list[Any] = []
        self._stacks_file: Any = None
        # Multi-process runs (torchrun): this process's rank, acceptrun's own collectives
        # (created on first use), and the state each rank saves for itself.
        from acceptrun.workload.distributed import rank_info

        self.ranks = rank_info()
        self.rank = self.ranks.rank
        self.world_size = self.ranks.world_size
        self._group: Any = None  # distributed.RankGroup
        self._per_rank: dict[str, Any] = {}
        self._stop_signal = False  # this rank got SIGTERM; _stop_requested: all ranks agreed
        self._stopping = False
        self._total_steps: int | None = None  # the end of the current steps() loop
        self._loop_stops = False  # handle_stops(): a framework's loop polls stop_requested
        self._batch: Any = None  # inference.BatchJob, created by the first run.inference

    def _rank_field(self) -> dict[str, Any]:
        """``{"rank": r}`` in a multi-process run; nothing otherwise (same events as before)."""
        return {"rank": self.rank} if self.ranks.distributed else {}

    def _rank_group(self) -> Any:
        """acceptrun's collectives (distributed.RankGroup), once torch.distributed is up.

        Created by every rank at the same point of the script (its first restore, step
        boundary or checkpoint after init_process_group); None before that.
        """
        if self._group is None and self.ranks.distributed:
            from acceptrun.workload.distributed import RankGroup, torch_distributed_ready

            if torch_distributed_ready():
                self._group = RankGroup(self.ranks)
        return self._group

    @property
    def spec(self) -> Any:
        """The frozen :class:`~acceptrun.spec.model.RunSpec` of this run (checkpoint intervals...)."""
        if self._spec is None:
            from acceptrun.spec.model import load_spec

            self._spec = load_spec(os.environ.get(ENV_SPEC) or self.record.spec_path)
        return self._spec

    def _event_sink(self, kind: str, fields: dict[str, Any]) -> None:
        if self.rank != 0 and not kind.endswith("_failed"):
            return  # rank 0 records the run's checkpoints; a rank's own failure it tells
        self.record.event(kind, attempt=self.attempt, **fields, **self._rank_field())

    def _lifecycle_event(self, kind: str, fields: dict[str, Any]) -> None:
        self.record.event(kind, sync=True, attempt=self.attempt, **fields)

    if TYPE_CHECKING:  # provided by the parts Run combines (loop, signals, checkpointing, watch)

        def _stop_agreed(self) -> bool: ...
        def _stop_at(self, step: int) -> None: ...
        def _finish_drill(self, step: int, seconds: float) -> None: ...
        def _fire_faults(self, step: int, phase: str) -> None: ...
        def _check_divergence(self, step: int, loss: float) -> None: ...
        def checkpoint(
            self, step: int, *, block: bool = False, metrics: dict[str, float] | None = None
        ) -> None: ...
        def finish(self, status: str = "ok") -> None: ...
        def _close_checkpoints_once(self) -> str | None: ...


def _number(value: Any) -> float | int:
    """A plain float/int from Python, NumPy or 0-d torch values (no torch import)."""
    t = type(value)
    if t is float or t is int:  # the common case, first (a logged step pays this per value)
        return value  # type: ignore[no-any-return]
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    item = getattr(value, "item", None)
    if callable(item):
        out = item()
        if isinstance(out, int | float):
            return out
    return float(value)
