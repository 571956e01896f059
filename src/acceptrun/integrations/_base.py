"""What every framework integration shares: attach, capture, resume point, put back, stop.

A framework (the Hugging Face Trainer, Accelerate, Lightning) owns the training loop and
writes its own checkpoint files. :class:`FrameworkRun` is the bridge to acceptrun for
such a loop, framework-neutral and without torch:

* :meth:`FrameworkRun.attach` joins the run (``acceptrun.init()``; a standalone run
  outside ``acceptrun run``) and takes SIGTERM as a stop request to poll
  (:meth:`~acceptrun.workload.run.Run.handle_stops`) instead of dying at once;
* :meth:`FrameworkRun.capture` copies a file or directory the framework just wrote into
  the run's :class:`~acceptrun.checkpoint.store.CheckpointStore` as one verified
  checkpoint (hashed, manifest, retention by the spec's keep_*, mirrored when
  ``checkpoint.mirror`` is set) and records the time it blocked training as the
  checkpoint stall;
* :meth:`FrameworkRun.resume_point` picks the checkpoint to resume from: the supervisor's
  ``ACCEPTRUN_RESUME_FROM`` if it still verifies, else the newest that does (a corrupted
  one is quarantined first); None on a fresh start;
* :meth:`FrameworkRun.put_back` copies it back where the framework reads it, verified
  and swapped in whole;
* :meth:`FrameworkRun.should_stop` decides a stop at a step boundary, the same on every
  rank; :meth:`FrameworkRun.exit_stopped` ends it: ``stopped`` event, exit 143.

In a run of several processes every rank makes the same calls: rank 0 picks and verifies
the checkpoint to resume from and puts it back while the others wait for it, rank 0
captures, and the ranks decide a stop together (see :meth:`FrameworkRun.should_stop`).

>>> fr = FrameworkRun.attach()
>>> info = fr.resume_point()                                   # None on a fresh start
>>> if info: fr.put_back(info, {"ckpt": "out/checkpoint-40"})
>>> fr.capture(50, {"ckpt": "out/checkpoint-50"})              # after the framework saved
>>> if fr.should_stop(50): fr.exit_stopped(50)                 # once per step, every rank
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from acceptrun.checkpoint.files import CaptureStats, capture, put_back, sources_of
from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore
from acceptrun.errors import AcceptrunRuntimeError, UserError
from acceptrun.run.standalone import init
from acceptrun.workload.run import Run

__all__ = ["FrameworkRun"]


class FrameworkRun:
    """One run driven by a framework's loop; checkpoints are the framework's own files."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.last_captured: int | None = None  # the step of the newest capture, or resume
        self.restore_seconds: float | None = None  # how long the last put_back took
        self.captures: list[CaptureStats] = []  # what each capture copied, in order
        self._store: CheckpointStore | None = None
        self._mirror: Any = None  # checkpoint.mirror.Mirror, created with the store

    @classmethod
    def attach(cls, name: str | None = None, *, one_process: bool = False) -> FrameworkRun:
        """Join the current run (or create a standalone one) and own its graceful stops.

        ``one_process``: refuse a run of several processes (a callback drives one).
        """
        run = init(name)
        if one_process and run.world_size > 1:
            raise UserError(
                f"AcceptrunCallback runs in one process; this run has {run.world_size} "
                "(resources.processes); set resources.processes = 1, or drive the ranks "
                "with the client API (docs/multi-process.md)"
            )
        run.handle_stops()
        return cls(run)

    def log(self, step: int, **values: float) -> None:
        """Write the step event of ``step``, a step the framework just finished.

        Through ``run.log``: injected step faults (``acceptrun run --inject
        kill@step=N``) fire there after the event is written, and a NaN or too-high loss
        ends the attempt as diverged.
        """
        self.run.log(step, **values)

    # ---- checkpoints -------------------------------------------------------------------------

    @property
    def store(self) -> CheckpointStore:
        """The run's checkpoint store, with the spec's retention; stale staging removed once."""
        if self._store is None:
            store: CheckpointStore = self.run._store()
            if self.run.rank == 0:
                store.remove_stale_staging()
            mirror_url = self.run.spec.checkpoint.mirror
            if mirror_url and self.run.rank == 0:
                from acceptrun.checkpoint.mirror import Mirror
                from acceptrun.checkpoint.owner import mirror_root, owner_of

                self._mirror = Mirror(
                    str(mirror_root(self.run.record, self.run.spec)),
                    owner=owner_of(self.run.record),
                    state_path=self.run.record.file("mirror.json"),
                    on_event=self.run._event_sink,
                )
                self._mirror.start()
            self._store = store
        return self._store

    def capture(
        self,
        step: int,
        sources: Mapping[str, str | os.PathLike[str]],
        *,
        metrics: Mapping[str, float] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> CheckpointInfo:
        """Copy ``sources`` (stored name -> file or directory) in as the checkpoint of ``step``.

        Blocks the caller for the copy (it reads and hashes every byte once: about the
        speed of a local file copy); that time is recorded as the checkpoint stall
        (``checkpoint_stage`` event), the commit as ``checkpoint_commit``. A failure is
        recorded (``checkpoint_failed``) and raised: the previous checkpoint is intact.
        """
        if self.run.drill:
            raise UserError("a restore drill runs one step and saves nothing; skip the capture")
        full_meta = {
            "run_id": self.run.run_id,
            "attempt": self.run.attempt,
            "spec_hash": self.run.record.state.get("spec_hash"),
            **dict(meta or {}),
        }
        clean = {k: float(v) for k, v in (metrics or {}).items() if _finite(v)}
        try:
            info, stats = capture(self.store, step, sources, metrics=clean, meta=full_meta)
        except Exception as exc:
            self.run._event_sink(
                "checkpoint_failed", {"step": step, "error": f"{type(exc).__name__}: {exc}"}
            )
            raise
        self.run._event_sink(
            "checkpoint_stage",
            {"step": step, "stall_s": round(stats.seconds, 6), "bytes": stats.bytes,
             "files": stats.files, "captured": True},
        )  # fmt: skip
        if self._mirror is not None:
            self._mirror.enqueue(info.step, info.path)
        self.captures.append(stats)
        self.last_captured = step
        return info

    def resume_point(self) -> CheckpointInfo | None:
        """The checkpoint to resume from, verified; None on a fresh start.

        Under ``acceptrun run`` the supervisor names it (``ACCEPTRUN_RESUME_FROM``); if
        it no longer verifies, the newest one that does is used and the bad ones are
        quarantined. A later attempt without that variable still resumes from the
        store's newest verified checkpoint. A checkpoint that holds no captured files
        (saved by ``run.checkpoint()``) cannot be put back into a framework's directory
        and raises :class:`UserError`.
        """
        run = self.run
        if not run.resume_from and not (run.attempt > 1 and not run.drill):
            return None
        group = run._rank_group()
        if group is None:
            step = self._verified_step()
        else:  # rank 0 verifies (one re-read, not one per rank); every rank gets its answer
            chosen: tuple[int | None, str | None] = (None, None)
            if run.rank == 0:
                try:
                    chosen = (self._verified_step(), None)
                except Exception as exc:  # raised on every rank, not only rank 0
                    chosen = (None, f"{type(exc).__name__}: {exc}")
            step, error = group.broadcast(chosen)
            if error is not None:
                raise AcceptrunRuntimeError(f"rank 0 could not pick the checkpoint: {error}")
        info = None if step is None else self.store.get(step)
        if info is None:
            return None
        if not sources_of(info):
            raise UserError(
                f"checkpoint {info.path} was saved by run.checkpoint(), not captured from a "
                "framework's files; resume it with run.restore(), or point checkpoint.dir "
                "of this spec at a directory of its own"
            )
        return info

    def _verified_step(self) -> int | None:
        """The step of the checkpoint to resume from, verified (see :meth:`resume_point`)."""
        run = self.run
        if run.resume_from:
            path = run._verified_resume_path(self.store, run.resume_from)[0]
            return int(path.name.split("-", 1)[1])
        info = self.store.latest_verified()
        return None if info is None else info.step

    def put_back(
        self, info: CheckpointInfo, targets: Mapping[str, str | os.PathLike[str]] | None = None
    ) -> dict[str, Path]:
        """Copy ``info``'s files back (to ``targets``: stored name -> path), verified.

        Records a ``restored`` event with the seconds it took. In a run of several
        processes (one machine, one file system) rank 0 copies while the others wait,
        then every rank gets the paths: all of them read the files after it returns.
        """
        t0 = time.perf_counter()
        group = self.run._rank_group()
        if group is None:
            placed = put_back(info, targets)
        else:
            done: tuple[dict[str, str] | None, str | None] = (None, None)
            if self.run.rank == 0:
                try:
                    done = ({k: str(v) for k, v in put_back(info, targets).items()}, None)
                except Exception as exc:  # raised on every rank, not only rank 0
                    done = (None, f"{type(exc).__name__}: {exc}")
            paths, error = group.broadcast(done)
            if error is not None or paths is None:
                raise AcceptrunRuntimeError(
                    f"rank 0 could not put back the checkpoint of step {info.step}: {error}"
                )
            placed = {k: Path(v) for k, v in paths.items()}
        seconds = time.perf_counter() - t0
        self.last_captured = info.step
        self.restore_seconds = seconds
        if not self.run.drill and self.run.rank == 0:
            self.run.record.event(
                "restored", sync=True, attempt=self.run.attempt, step=info.step,
                path=str(info.path), seconds=round(seconds, 4),
                notes=[f"put back {name} -> {dest}" for name, dest in placed.items()],
            )  # fmt: skip
        return placed

    # ---- stops and the end -------------------------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        """True once the run is to stop (``acceptrun stop``, a preemption, a limit).

        In a run of several processes, True on every rank from the :meth:`should_stop`
        that decided the stop (see :attr:`~acceptrun.workload.run.Run.stop_requested`).
        """
        return self.run.stop_requested

    def should_stop(self, step: int) -> bool:
        """Whether to stop after ``step`` (the optimizer step just finished); every rank's answer.

        Call it from exactly one hook that runs once per optimizer step on every rank
        (the Trainer's ``on_step_end``, Lightning's ``on_train_batch_end`` after an
        optimizer step, the Accelerate tracker's step boundary): in a run of several
        processes it is a collective (:meth:`~acceptrun.workload.run.Run.should_stop`).
        """
        return self.run.should_stop(step)

    def exit_stopped(self, step: int) -> NoReturn:
        """Record the stop after ``step`` with the newest capture as its checkpoint; exit 143.

        Every rank calls it after the same :meth:`should_stop`; they exit together.
        """
        self.close()
        self.run.exit_stopped(step, checkpoint=self.last_captured)

    def close(self, mirror_timeout: float = 60.0) -> None:
        """Give the mirror up to ``mirror_timeout`` seconds to catch up, then stop it."""
        if self._mirror is None:
            return
        mirror, self._mirror = self._mirror, None
        if not mirror.wait(mirror_timeout):
            self.run._event_sink(
                "mirror_behind", {"status": {str(k): v for k, v in mirror.status().items()}}
            )
        mirror.close(timeout=5)


def _finite(value: Any) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return number == number and abs(number) != float("inf")
