"""The step a watched checkpoint holds, and dating it again once a later report proves it.

A script's own checkpoint says its step in its content (:func:`step_in_content`: a
Trainer's ``trainer_state.json``, a JSON sidecar), in its name (:func:`step_from_name`),
or not at all: then the newest step the attempt reported before the file was written
dates it (the client's steps, TensorBoard's scalars by their own time, output lines by
the time the supervisor's tee read them: supervisor/progress.py), never later than the
state it holds, so lost work is never under-counted. Where that is not proven, the
capture is an estimate and says why; one that a later report can prove is held in
:attr:`CaptureDating.undated` and moved to its proven step by :meth:`CaptureDating.redate`
(checkpoint/redating.py), in a chain when a newer capture holds that step.
:class:`~acceptrun.supervisor.external.CheckpointWatcher` captures, this module dates.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acceptrun._util.durable import loads_json, read_bytes_bounded
from acceptrun.checkpoint.redating import redate_in_order
from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore
from acceptrun.errors import RecordError
from acceptrun.supervisor.axis import StepAxis

if TYPE_CHECKING:
    from acceptrun.supervisor.progress import ProgressReader

__all__ = ["SIDECAR_SKEW_S", "CaptureDating", "step_from_name", "step_in_content"]

_LAST_INT = re.compile(r"(\d+)(?!.*\d)")
_CLOCK_REALTIME_COARSE = 5  # Linux's clock id; the time module does not name it


def _file_time_slack() -> float:
    """Seconds a file's mtime may trail the moment it was written.

    Linux stamps a file from its coarse clock unless its times were read since the last
    change, so the mtime can be up to one clock tick early (4 ms at HZ=250, 10 ms at
    HZ=100): a scalar logged just before a save can carry a later time than the save's
    mtime. Measured where the clock can be asked, else the slowest common tick.
    """
    try:
        return max(time.clock_getres(_CLOCK_REALTIME_COARSE), 0.001)
    except (AttributeError, OSError):
        return 0.01


FILE_TIME_SLACK_S = _file_time_slack()
EventSink = Callable[[str, dict[str, Any]], None]


def step_from_name(path: str | os.PathLike[str]) -> int | None:
    """The last integer in a file or directory name: ``checkpoint-500`` -> 500, else None."""
    match = _LAST_INT.search(Path(path).name)
    return int(match.group(1)) if match else None


_STEP_KEYS = ("global_step", "step", "iter_num", "iteration")  # a sidecar's step, in order
SIDECAR_SKEW_S = 5.0  # seconds a JSON sidecar may be apart from its checkpoint to date it


def step_in_content(path: str | os.PathLike[str]) -> tuple[int, str] | None:
    """The step a checkpoint says it holds, in a readable form: ``(step, how)`` or None.

    A directory holding ``trainer_state.json`` (the Hugging Face Trainer's, written with
    every checkpoint): its ``global_step``. A file or directory with a JSON sidecar
    beside it (``ckpt.pt.json`` or ``ckpt.json`` for ``ckpt.pt``) written within
    :data:`SIDECAR_SKEW_S` seconds of it: its ``global_step``, ``step``, ``iter_num`` or
    ``iteration``, the first there, a whole number. Read within the record's JSON limits
    (:func:`~acceptrun._util.durable.loads_json`); anything else is None, and the step is
    then dated by the name or the reported steps.
    """
    target = Path(path)
    candidates: list[tuple[Path, tuple[str, ...], bool]] = []
    if target.is_dir():
        candidates.append((target / "trainer_state.json", ("global_step",), False))
    candidates.append((target.with_name(target.name + ".json"), _STEP_KEYS, True))
    if target.suffix:
        candidates.append((target.with_suffix(".json"), _STEP_KEYS, True))
    for candidate, keys, sidecar in candidates:
        if candidate == target:
            continue  # ckpt.json is the checkpoint, not its sidecar
        try:
            if not candidate.is_file():
                continue
            if sidecar:
                apart = abs(candidate.stat().st_mtime - _newest_mtime(target))
                if apart > SIDECAR_SKEW_S:
                    continue  # a sidecar of another save
            data = loads_json(read_bytes_bounded(candidate))
        except (OSError, ValueError, RecordError):
            continue
        if not isinstance(data, dict):
            continue
        for key in keys:
            value = data.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value, f"{key} in {candidate.name}"
    return None


def _logged_by(event: dict[str, Any], mtime: float) -> bool:
    """Whether a step event's logging call can have come before a file of ``mtime``.

    A client step or a TensorBoard scalar carries the time of its logging call; the file's
    mtime may trail its write by a coarse clock tick (FILE_TIME_SLACK_S), so a step logged
    up to then counts as before it: a script that logs and saves within one tick (the
    common log-then-save) is dated by that step. An output line is stamped when the tee
    read it, after it was printed, so no slack: a line read after the mtime does not
    count, which errs towards an earlier step, never a later one.
    """
    slack = 0.0 if event.get("source") == "log" else FILE_TIME_SLACK_S
    return bool(event["t"] <= mtime + slack)


def _newest_mtime(path: Path) -> float:
    if not path.is_dir():
        return path.stat().st_mtime
    return max((f.stat().st_mtime for f in path.rglob("*") if f.is_file()), default=0.0)


class CaptureDating:
    """Dates one attempt's watched captures by what the attempt reported.

    ``events`` returns the attempt's events, or (count, recent steps) as
    AttemptWatch.step_window does; ``progress``, when the script's progress is read from
    its output or TensorBoard, is the reader, whose steps are taken as it writes them.
    """

    def __init__(
        self,
        store: CheckpointStore,
        *,
        events: Callable[[], Any],
        on_event: EventSink,
        tensorboard: bool = False,
        axis: StepAxis | None = None,
        resume_step: int | None = None,
    ) -> None:
        self.store = store
        self.events = events
        self.on_event = on_event
        self.tensorboard = tensorboard  # steps from TensorBoard files, flushed late
        self.axis = axis  # a name's step on the run's axis (supervisor/axis.py)
        self.resume_step = resume_step
        self.progress: ProgressReader | None = None
        # Captures whose step is an estimate a later report may prove: step -> (the
        # file's mtime, its path).
        self.undated: dict[int, tuple[float, str]] = {}

    def hold(self, step: int, mtime: float, path: str) -> None:
        """Date the capture at ``step`` again once a later report proves its step."""
        self.undated[step] = (mtime, path)

    def _window(self) -> tuple[int, list[dict[str, Any]]]:
        """(events read so far, the newest of them): ``events`` may return a list (all of
        them) or such a pair (AttemptWatch.step_window: its recent steps only)."""
        got = self.events()
        return got if isinstance(got, tuple) else (len(got), list(got))

    def step_for(self, path: str, mtime: float) -> tuple[int, dict[str, Any]]:
        """The capture's step, and how it was known (``dated`` in its manifest's meta).

        In order: the step the checkpoint says it holds (:func:`step_in_content`), the
        number in its name, the newest step reported before it was written. ``estimate``
        is set where the step is not proven (:meth:`_estimate`): reported steps with a
        gap around the file's time, a step read from the output, none reported after it
        yet, or none before it (the step the attempt resumed from, or the newest stored
        + 1). ``pending`` marks an estimate that a later report can prove: the capture is
        dated again then (:meth:`redate`).
        """
        own = step_in_content(path)
        if own is not None:
            value, how = own
            step = value if self.axis is None else self.axis.run_step(value, f"{how} of {path}")
            return step, {"by": how}
        named = step_from_name(path)
        if named is not None:
            step = named if self.axis is None else self.axis.run_step(named, f"name of {path}")
            return step, {"by": "the number in its name"}
        before = self._step_events_before(mtime)
        if before:
            dated: dict[str, Any] = {"by": "the newest step reported before it was written"}
            estimate, pending = self._estimate(before[-1], mtime)
            if estimate:
                dated["estimate"] = estimate
                dated["pending"] = pending
            return int(before[-1]["step"]), dated
        if self.resume_step is not None:
            return self.resume_step, {
                "by": "the step the attempt resumed from",
                "estimate": "no step was reported before the file was written",
            }
        return self.store.next_free_step(), {
            "by": "numbered after the newest stored checkpoint",
            "estimate": "no step was reported before the file was written",
        }

    def _estimate(self, before: dict[str, Any], mtime: float) -> tuple[str | None, bool]:
        """Why dating by ``before`` (the newest step reported before ``mtime``) may be wrong.

        ``(None, False)`` when proven: the next step reported, logged after the file was
        written, is ``before``'s successor, so the file holds ``before``'s state. Else
        the reason, and whether a later report can still prove it (no step logged after
        the file is known yet).
        """
        step = int(before["step"])
        if before.get("source") == "log":
            # A line's time is when it was read: a line printed before the save may be
            # read after it, so the next line proves nothing.
            return (
                "dated by the output lines read before it was written; a line printed "
                "before the save but read after it would make it a later step",
                False,
            )
        after = self._next_step_after(mtime)
        if after is None:
            if not self._covered(mtime):
                return (
                    "TensorBoard had not yet reported a step logged after the file was "
                    "written, so a later step may be the one it holds",
                    True,
                )
            return (
                "no step logged after the file was written was reported yet, so a later "
                "step may be the one it holds",
                True,
            )
        if after > step + 1:
            return (
                f"steps are reported every few steps: {step} before it was written and "
                f"{after} after, so it holds one of steps {step} to {after - 1}",
                False,
            )
        return None, False

    def _next_step_after(self, mtime: float) -> int | None:
        """The first step whose logging call came after ``mtime`` (client, TensorBoard)."""
        after = [
            e["step"]
            for e in self._recent_steps()
            if e.get("source") != "log" and not _logged_by(e, mtime)
        ]
        return min(after) if after else None

    def _covered(self, mtime: float) -> bool:
        """Whether every step logged before ``mtime`` is known by now.

        Client steps and parsed lines are read as they are written; TensorBoard's event
        files are flushed by the script's SummaryWriter (every 120 s by default), so its
        steps are known up to ``mtime`` once one logged later has been read. What a
        writer had not flushed when its process ended (killed, or never closed) is lost:
        the step then stays an estimate, and says so.
        """
        if not self.tensorboard:
            return True
        return any(
            e.get("source") == "tensorboard" and e["t"] >= mtime + FILE_TIME_SLACK_S
            for e in self._recent_steps()
        )

    def redate(
        self, *, final: bool = False
    ) -> tuple[dict[int, CheckpointInfo], dict[int, Exception]]:
        """Date again the captures whose step was an estimate, once the steps are known.

        A capture dated before TensorBoard's step was read (or with no step at all) is
        stored under the step now proven (:meth:`CheckpointStore.redate`, a
        ``checkpoint_redated`` event) once a step logged after the file was written has
        been read; at the end of the attempt (``final``), with what is known then, its
        manifest still saying that the step is an estimate.

        In a chain: a capture whose proven step another capture still holds on an
        estimate (a TensorBoard script that logs and saves every 500 steps: each capture
        dated one save behind until the next proves it) waits for that one to move, and
        the moves of one pass are made newest first
        (checkpoint/redating.py), so no capture stays one save behind.
        A proven step held by a capture that is not an estimate, or by one retention
        deleted, is never taken: the capture keeps its step and its estimate. Returns the
        captures moved (their old step -> the new checkpoint) and those that failed.
        """
        moves: dict[int, tuple[int, dict[str, Any]]] = {}
        for step, (mtime, _path) in sorted(self.undated.items()):
            if self.store.get(step) is None:  # retention removed it meanwhile
                self.undated.pop(step)
                continue
            known = self._covered(mtime) and self._next_step_after(mtime) is not None
            if not (known or final):
                continue
            before = self._step_events_before(mtime)
            if not before:
                self.undated.pop(step)  # nothing better known: as it is
                continue
            proven = int(before[-1]["step"])
            dated: dict[str, Any] = {"by": "the newest step reported before it was written"}
            if proven != step:
                dated["redated_from"] = step
            estimate, _ = self._estimate(before[-1], mtime)
            if estimate and not known:
                estimate = (
                    "no step logged after the file was written was ever reported, so a "
                    "later step may be the one it holds"
                )
            if estimate:
                dated["estimate"] = estimate
            moves[step] = (proven, {"dated": dated})
        if not moves:
            return {}, {}
        room = self._make_room(moves, final)  # still estimates once moved
        moves |= room
        done, failed = redate_in_order(self.store, moves)
        for step in failed:
            self.undated.pop(step, None)
        for step, info in done.items():
            mtime, path = self.undated.pop(step)
            dated = moves[step][1]["dated"]
            if step in room:  # moved up to make room: dated again once proven
                self.undated[info.step] = (mtime, path)
            self.on_event(
                "checkpoint_redated",
                {"step": info.step, "redated_from": step, "source_path": path,
                 "dated_by": dated["by"], "estimate": "estimate" in dated},
            )  # fmt: skip
        for step, (proven, _meta) in moves.items():
            if step in done or step in failed or step in room:
                continue
            # Held by a capture still waiting for its own proof: retried when that moves.
            if not final and proven in self.undated:
                continue
            self.undated.pop(step, None)  # held by a proven save, or once was: as it is
        return done, failed

    def _make_room(
        self, moves: dict[int, tuple[int, dict[str, Any]]], final: bool
    ) -> dict[int, tuple[int, dict[str, Any]]]:
        """Moves up the captures that hold, on an estimate, a step now proven for another.

        A capture written after the one proven to hold step P, and dated P itself only
        because no later step was known when it was taken, holds P + 1 or later: it moves
        to P + 1 (still an estimate, dated again once proven), so the earlier capture
        takes P now rather than at the end of the attempt.
        """
        room: dict[int, tuple[int, dict[str, Any]]] = {}
        for step, (proven, _meta) in moves.items():
            holder = self.undated.get(proven)
            if final or proven == step or holder is None or proven in moves:
                continue
            if holder[0] <= self.undated[step][0] or self.store.taken(proven + 1):
                continue  # not written after it, or no room: it waits for its proof
            dated = {
                "by": f"written after the checkpoint proven to hold step {proven}",
                "estimate": f"it holds step {proven + 1} or later, proven once a step "
                "logged after it is read",
                "redated_from": proven,
            }
            room[proven] = (proven + 1, {"dated": dated})
        return room

    def _step_events_before(self, mtime: float) -> list[dict[str, Any]]:
        """Step events reported before the file was written (its newest ``mtime``), oldest first.

        The client's and TensorBoard's step times are those of the logging call itself,
        whenever read. An output line counts when the supervisor's tee had read it before
        the mtime (a line printed after the save began cannot have been), whatever time
        its event was given (ProgressReader.steps_before). A line still in the pipe at
        the mtime is not counted, which errs towards an earlier step: it over-counts lost
        work rather than hiding it.
        """
        if self.progress is not None:
            return self.progress.steps_before(mtime, slack=FILE_TIME_SLACK_S)
        return [e for e in self._recent_steps() if _logged_by(e, mtime)]

    def _recent_steps(self) -> list[dict[str, Any]]:
        """The attempt's newest step events with an integer step and a time, oldest first:
        the progress reader's as it writes them, else the client's read back."""
        recent = self.progress.recent_steps() if self.progress is not None else self._window()[1]
        return [
            e
            for e in recent
            if e.get("kind") == "step"
            and isinstance(e.get("step"), int)
            and isinstance(e.get("t"), int | float)
        ]

    def metrics_at(self, mtime: float) -> dict[str, float]:
        """The loss of the step the file holds (for checkpoint.keep_best), when known."""
        before = self._step_events_before(mtime)
        loss = before[-1].get("loss") if before else None
        if isinstance(loss, int | float) and not isinstance(loss, bool) and math.isfinite(loss):
            return {"loss": float(loss)}
        return {}
