"""Asynchronous checkpoint saves: stage on the training thread, persist in the background.

The training loop is blocked only while :func:`~acceptrun.checkpoint.staging.stage` copies
the state into host memory (into reused buffers, pinned for CUDA tensors). With
``overlap`` (the default; ``[checkpoint] staging = "overlap"``) even less: when the
objects hold a torch.optim optimizer, the parameters and optimizer state in host memory
(what only an optimizer's step changes) are copied by the background thread beside the
next forward and backward, and the next ``step()`` of any torch.optim optimizer waits for
that copy (a global step pre-hook); the loop is blocked only if it gets there first. A
tensor changed in place some other way before it was copied fails the save loudly
(:class:`~acceptrun.checkpoint.staging.StateChangedDuringCopy`) rather than write a
snapshot that is not its step's. A background thread then writes the safetensors and
JSON files through the store (hashing as it writes), commits the manifest and LATEST,
applies retention, and hands the checkpoint to the mirror. The next save, or the end of the run, waits for it; a failure is recorded as
an event at once and raised on the next call, never swallowed.

With ``ranks`` (a :class:`~acceptrun.workload.distributed.RankGroup`, one process per rank) a save
is gathered: rank 0 stages the replicated state (``objects``), every rank its own
(``per_rank`` and its RNG states). In the background, rank 0 begins the save and tells
the others its staging directory; each writes its own files under ``rank-<r>/``; an
all_gather of the files written is the barrier after which rank 0 commits (MANIFEST,
LATEST); a broadcast tells every rank the outcome, so a failure is raised on all of them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from acceptrun._util.durable import storage_fault
from acceptrun._util.units import format_bytes
from acceptrun.checkpoint.mirror import Mirror
from acceptrun.checkpoint.overlap import Overlap
from acceptrun.checkpoint.staging import Staged, StagingBuffers, stage, write_staged
from acceptrun.checkpoint.state import rank_dir
from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore
from acceptrun.checkpoint.tensorfile import BinarySink
from acceptrun.checkpoint.writer import CheckpointWriter
from acceptrun.errors import AcceptrunError, DiskFullError

__all__ = ["CheckpointDiskFullError", "CheckpointError", "Checkpointer"]

EventSink = Callable[[str, dict[str, Any]], None]


class CheckpointError(AcceptrunError):
    """A background checkpoint save failed; the previous checkpoint is intact."""


class CheckpointDiskFullError(CheckpointError, DiskFullError):
    """A save failed because the checkpoint directory's file system is full.

    Also an :class:`OSError` (``errno`` ENOSPC, EDQUOT or EFBIG, ``filename`` the
    directory), as the raw error it replaces was. ``directory``, ``needed`` and ``free``
    (bytes) say where and how much; ``intact`` is the step of the previous checkpoint,
    verified after the failure (None when there was none).
    """

    intact: int | None = None


class Checkpointer:
    """One run's saves: at most one in flight, its failure surfaced on the next call."""

    def __init__(
        self,
        store: CheckpointStore,
        *,
        mirror: Mirror | None = None,
        on_event: EventSink | None = None,
        meta: Mapping[str, Any] | None = None,
        ranks: Any = None,
        overlap: bool = True,
    ) -> None:
        self.store = store
        self.overlap = overlap
        self.ranks = ranks  # distributed.RankGroup: a gathered save over all ranks
        self.mirror = mirror
        self.on_event = on_event or (lambda _kind, _fields: None)
        self.meta = dict(meta or {})
        self.last_committed: CheckpointInfo | None = None
        self._buffers = StagingBuffers()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._error_step: int | None = None
        self._own_buffers = StagingBuffers()  # this rank's own state, beside the shared one
        if mirror is not None:  # retention applies to the mirror too
            store.subscribe(self._retire_in_mirror)

    def _retire_in_mirror(self, kind: str, fields: Mapping[str, Any]) -> None:
        """A checkpoint retention deleted locally goes from the mirror too (never blocks)."""
        retention = str(fields.get("reason") or "").startswith("retention")
        if kind == "checkpoint_delete" and retention and not fields.get("error"):
            assert self.mirror is not None
            self.mirror.retire(int(fields["step"]))

    def save(
        self,
        step: int,
        objects: Mapping[str, Any],
        *,
        metrics: Mapping[str, float] | None = None,
        block: bool = False,
        per_rank: Mapping[str, Any] | None = None,
    ) -> float:
        """Snapshot ``objects`` as the state after ``step``; returns the stall in seconds.

        Blocks the training loop for the previous save to finish (normally long done)
        plus the host copy of the state. ``block=True`` also waits for the commit (used
        before exiting on a stop request). With ``ranks``, every rank calls it at the
        same step: ``objects`` are saved from rank 0, ``per_rank`` from each rank.

        The ``checkpoint_stage`` event's ``stall_s`` is all the time the call blocked its
        caller: the wait for the previous save, the copy and, with ``block``, the commit
        (then the event comes after the commit). It is the save cost δ of the interval
        advice (docs/checkpoint-interval.md).
        """
        t0 = time.perf_counter()
        self.wait()
        if self.ranks is not None:
            return self._save_ranked(step, objects, per_rank or {}, dict(metrics or {}), block)
        staged = stage(objects, buffers=self._buffers, defer=self.overlap and not block)
        nbytes = staged.nbytes
        stall = time.perf_counter() - t0
        copy = self._defer(step, stall, nbytes, [staged])
        if not block and copy is None:
            self.on_event(
                "checkpoint_stage", {"step": step, "stall_s": round(stall, 6), "bytes": nbytes}
            )
        self._thread = threading.Thread(
            target=self._persist,
            args=(step, staged, dict(metrics or {}), copy),
            name=f"acceptrun-save-{step}",
            daemon=True,
        )
        self._thread.start()
        if block:
            self.wait()
            stall = time.perf_counter() - t0
            self.on_event(
                "checkpoint_stage", {"step": step, "stall_s": round(stall, 6), "bytes": nbytes}
            )
        return stall

    def _defer(
        self, step: int, stall: float, nbytes: int, snapshots: list[Staged | None]
    ) -> tuple[Overlap, list[Staged]] | None:
        """An armed :class:`Overlap` and the snapshots it copies, when any left tensors."""
        pending = [s for s in snapshots if s is not None and s.pending]
        if not pending:
            return None
        overlap = Overlap(step, stall, nbytes, self.on_event)
        overlap.arm()
        return overlap, pending

    def _persist(
        self,
        step: int,
        staged: Staged,
        metrics: dict[str, float],
        copy: tuple[Overlap, list[Staged]] | None = None,
    ) -> None:
        writer = None
        needed = staged.nbytes  # write_staged releases the buffers; the size is kept
        try:
            if copy is not None:
                _copy_all(*copy)
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
            self._fail(step, exc, needed)

    def _fail(
        self,
        step: int,
        exc: BaseException,
        needed: int,
        full: CheckpointDiskFullError | None = None,
    ) -> None:
        """Keep ``exc`` for the next call and record it (a full disk with its figures)."""
        full = full or self._disk_full(step, exc, needed)
        self._error, self._error_step = (full or exc), step
        fields: dict[str, Any] = {"step": step, "error": f"{type(exc).__name__}: {exc}"}
        if full is not None:
            fields = {
                "step": step, "error": str(full), "fault": "disk full",
                "directory": full.directory, "needed_bytes": full.needed,
                "free_bytes": full.free, "intact_step": full.intact,
            }  # fmt: skip
        self.on_event("checkpoint_failed", fields)

    def _disk_full(
        self, step: int, exc: BaseException, needed: int
    ) -> CheckpointDiskFullError | None:
        """A :class:`CheckpointDiskFullError` when ``exc`` (or its cause) is a full disk.

        Runs after the abort, so ``free`` is what the file system has with the failed
        save's staging directory gone; the previous checkpoint is re-read and verified
        (one read of it, on this failure path only) before the message says it is intact.
        """
        cause: BaseException | None = exc
        while cause is not None and not (
            isinstance(cause, OSError) and storage_fault(cause) == "disk full"
        ):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            return None
        assert isinstance(cause, OSError)
        root = self.store.root
        free: int | None = None
        with contextlib.suppress(OSError):  # the message then says "unknown"
            free = shutil.disk_usage(root).free
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        limit = None if soft == resource.RLIM_INFINITY else soft
        intact, verified = self._previous()
        reason = os.strerror(cause.errno) if cause.errno else "disk full"
        if cause.errno == errno.EFBIG:
            where = (
                f"a file of it in {root} would pass this process's file-size limit of "
                f"{format_bytes(limit)}"
                if limit is not None
                else f"a file of it is larger than the file system of {root} allows"
            )
            fix = (
                "Raise the file-size limit for the run (`ulimit -f unlimited`)"
                if limit is not None
                else "Set [checkpoint] dir to a file system that allows larger files"
            )
        else:
            has = "free space unknown" if free is None else f"{format_bytes(free)} free"
            where = f"{root} is full: the checkpoint needs at least {format_bytes(needed)}, {has}"
            short = free is not None and needed > free
            more = f"at least {format_bytes(needed - (free or 0))} of " if short else ""
            fix = (
                f"Free {more}space in {root}, lower [checkpoint] keep_last, or set "
                "[checkpoint] dir to a larger file system"
            )
        if intact is None:
            kept, resume = "there is no earlier checkpoint", "starts again from step 0"
        elif verified:
            kept = f"step {intact}, the previous checkpoint, is intact and verified"
            resume = f"continues from step {intact}"
        else:
            kept = f"step {intact}, the previous checkpoint, fails verification (`acceptrun ckpt verify RUN`)"
            resume = "continues from the newest checkpoint that verifies"
        message = (
            f"the checkpoint of step {step} was not saved: {where} ({reason}). The save was "
            f"abandoned; {kept}. {fix}; then `acceptrun resume RUN` {resume}."
        )
        full = CheckpointDiskFullError(
            message, errno=cause.errno or 0, directory=str(root), needed=needed, free=free
        )
        full.intact = intact if verified else None
        return full

    def _previous(self) -> tuple[int | None, bool]:
        """The newest committed checkpoint's step, and whether it verifies (nothing moved)."""
        try:
            info = self.store.latest()
            return (None, False) if info is None else (info.step, self.store.verify(info.step).ok)
        except (OSError, AcceptrunError):
            return None, False

    def _save_ranked(
        self,
        step: int,
        objects: Mapping[str, Any],
        per_rank: Mapping[str, Any],
        metrics: dict[str, float],
        block: bool,
    ) -> float:
        info = self.ranks.info
        ranks = {"world_size": info.world_size, "rank": info.rank, "layout": "gathered"}
        t0 = time.perf_counter()
        shared = None
        defer = self.overlap and not block
        if info.rank == 0:  # replicated state: one copy is enough, rank 0's
            shared = stage(objects, rng=False, buffers=self._buffers, defer=defer)
            shared.meta["ranks"] = {**ranks, "rank": None}
        try:
            own = stage(per_rank, rng=True, buffers=self._own_buffers, defer=defer)
        except BaseException:
            if shared is not None:
                shared.release()
            raise
        own.meta["ranks"] = ranks
        stall = time.perf_counter() - t0
        nbytes = own.nbytes + (shared.nbytes if shared is not None else 0)
        copy = self._defer(step, stall, nbytes, [shared, own])
        if copy is None:
            self.on_event(
                "checkpoint_stage", {"step": step, "stall_s": round(stall, 6), "bytes": nbytes}
            )
        self._thread = threading.Thread(
            target=self._persist_ranked,
            args=(step, shared, own, metrics, copy),
            name=f"acceptrun-save-{step}",
            daemon=True,
        )
        self._thread.start()
        if block:
            self.wait()
        return stall

    def _persist_ranked(
        self,
        step: int,
        shared: Staged | None,
        own: Staged,
        metrics: dict[str, float],
        copy: tuple[Overlap, list[Staged]] | None = None,
    ) -> None:
        """Every rank runs this in its saver thread; the collectives keep them in step.

        Each collective is reached on every rank whatever failed before it, so a failure
        on one rank becomes a failed save on all, never a rank waiting forever.
        """
        group, rank = self.ranks, self.ranks.info.rank
        writer: CheckpointWriter | None = None
        failure: str | None = None
        needed = own.nbytes + (shared.nbytes if shared is not None else 0)
        local: BaseException | None = None  # this rank's own failure, if any
        try:
            try:
                if copy is not None:  # a failed copy fails the save on every rank
                    _copy_all(*copy)
                if rank == 0:
                    writer = self.store.begin(step)
            except BaseException as exc:
                local, failure = exc, f"{type(exc).__name__}: {exc}"
            path = group.broadcast(
                str(writer.path) if writer is not None else None, background=True
            )
            report: tuple[Any, Any, str | None] = ({}, [], failure)
            if failure is None:
                try:
                    if path is None:
                        raise RuntimeError("rank 0 could not begin the save")
                    if writer is None:
                        writer = self.store.join(step, Path(path))
                    if shared is not None:
                        write_staged(shared, writer)
                    write_staged(own, _Prefixed(writer, rank_dir(rank) + "/"))
                    files, dirs = writer.written()
                    report = (files, dirs, None)
                except BaseException as exc:
                    local, report = exc, ({}, [], f"{type(exc).__name__}: {exc}")
            # The barrier: every rank has written and fsynced its files, or failed.
            reports = group.all_gather(report, background=True)
            outcome: tuple[bool, str] = (False, "")
            if rank == 0:
                outcome = (
                    self._commit_ranked(writer, reports, metrics)
                    if writer is not None
                    else (False, f"rank 0: {failure}")
                )
            ok, detail = group.broadcast(outcome, background=True)
        except BaseException as exc:  # a collective failed: a peer died
            ok, detail = False, f"{type(exc).__name__}: {exc}"
            if writer is not None and writer.owner and writer.state == "open":
                self.store.abort(writer)
        finally:
            for staged in (shared, own):
                if staged is not None:
                    staged.release()  # no-op when written (write_staged released it)
        if ok:
            if rank == 0:
                self.store.apply_retention()  # a failed delete is reported, never raised
            self.last_committed = self.store.get(step)
            if self.mirror is not None and self.last_committed is not None:
                self.mirror.enqueue(step, self.last_committed.path)
            return
        if local is not None and (full := self._disk_full(step, local, needed)) is not None:
            self._fail(step, local, needed, full)  # this rank met the full disk itself
            return
        self._error, self._error_step = RuntimeError(detail), step
        self.on_event("checkpoint_failed", {"step": step, "error": detail})

    def _commit_ranked(
        self,
        writer: CheckpointWriter,
        reports: list[tuple[Any, Any, str | None]],
        metrics: dict[str, float],
    ) -> tuple[bool, str]:
        """Rank 0: adopt the other ranks' files and commit, or abort if any rank failed."""
        errors = [f"rank {r}: {fail}" for r, (_, _, fail) in enumerate(reports) if fail]
        try:
            if errors:
                raise RuntimeError("; ".join(errors))
            for files, dirs, _ in reports[1:]:
                writer.adopt(files, dirs)
            meta = {**self.meta, "world_size": len(reports), "layout": "gathered"}
            # Pruned after every rank is told (below): the others need not wait for it.
            info = self.store.commit(writer, metrics=metrics, meta=meta, retain=False)
        except BaseException as exc:
            if writer.state == "open":
                self.store.abort(writer)
            return False, str(exc) if errors else f"{type(exc).__name__}: {exc}"
        return True, str(info.path)

    def wait(self) -> CheckpointInfo | None:
        """Wait for the save in flight; raise CheckpointError if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            exc, step = self._error, self._error_step
            self._error = self._error_step = None
            if isinstance(exc, CheckpointDiskFullError):
                # Its message says it all; the chained OSError would only repeat it raw.
                raise exc from None
            raise CheckpointError(
                f"the checkpoint of step {step} was not saved ({type(exc).__name__}: {exc}); "
                "the previous checkpoint is intact. Fix the cause (disk space, permissions) "
                "and the next save will retry."
            ) from exc
        return self.last_committed

    def close(self, *, mirror_timeout: float | None = 60.0, failing: bool = False) -> None:
        """Wait for the last save, then give the mirror up to ``mirror_timeout`` s to catch
        up (``failing``: the workload is dying, so only while the mirror is healthy)."""
        try:
            self.wait()
        finally:
            if self.mirror is not None:
                if not self.mirror.wait(mirror_timeout, while_healthy=failing):
                    self.on_event(
                        "mirror_behind",
                        {"status": {str(k): v for k, v in self.mirror.status().items()}},
                    )
                self.mirror.close(timeout=5)


def _copy_all(overlap: Overlap, snapshots: list[Staged]) -> None:
    """The deferred copies of a save's snapshots (its background thread)."""
    overlap.run(lambda: [staged.copy_pending() for staged in snapshots])


class _Prefixed:
    """A writer whose files go under ``prefix`` (a rank's own ``rank-<r>/``)."""

    def __init__(self, writer: CheckpointWriter, prefix: str) -> None:
        self.writer = writer
        self.prefix = prefix

    def open(self, name: str) -> AbstractContextManager[BinarySink]:
        return self.writer.open(self.prefix + name)
