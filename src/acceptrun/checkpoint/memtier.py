"""The memory tier: the newest training state in host shared memory, beside the durable store.

A restart after a kill loses the steps since the last durable checkpoint and pays a read
of it from disk. The memory tier keeps a much more recent copy (``[checkpoint]
memory_every``, e.g. every step) in a directory of host shared memory that the supervisor
owns: it outlives the workload's death (a SIGKILL, an OOM kill, a crash) but not the
machine's, so it is never counted as durable. The layout, the manifest and the hashes are
the store's own (a :class:`MemoryStore` is a :class:`CheckpointStore` rooted there), so a
memory copy is written atomically (a staging directory, then one rename) and verified on
restore exactly as a disk one is.

The API (the supervisor's side, then the workload's):

- :data:`ENV_MEMORY_DIR`: the contract variable naming the tier's directory; unset, the
  tier is off;
- :func:`prepare` (supervisor, before an attempt): the run's directory, created by
  :func:`memory_dir` (``/dev/shm/acceptrun-<run id>``; without ``/dev/shm``, ``memory/``
  in the run record, with a note saying so) and recorded (a ``memory_tier`` event) the
  first time; :func:`remove_memory_dir` (the run's close) removes it;
- :class:`MemoryTier` (workload): :meth:`~MemoryTier.save` stages the state (one host
  copy, overlapped with the next step like a durable save) and writes it in the
  background; :meth:`~MemoryTier.adopt` copies a durable commit in (the step where both
  fall: the loop made one host copy); :meth:`~MemoryTier.candidate` picks the copy a
  restart may resume from, :meth:`~MemoryTier.figures` and :meth:`~MemoryTier.close`.

A memory copy records ``durable_step``: the newest durable checkpoint committed (or
resumed from) when it was saved. A restart uses it only when it is newer than the
durable resume point and built on it (``durable_step`` at most the resume step): after a
rollback (the supervisor set the newest durable checkpoint aside) the memory copy holds
the abandoned line and is removed, not restored.

>>> tier = MemoryTier(Path("/dev/shm/acceptrun-r1"))  # doctest: +SKIP
>>> tier.save(41, {"model": model, "optimizer": opt}, durable_step=39)  # doctest: +SKIP
>>> tier.candidate(resume_step=39)  # doctest: +SKIP
Candidate(info=CheckpointInfo(step=41, ...), expect='xxh3_128:...', rejected=[])
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.console import get_logger
from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore
from acceptrun.record.workspace import RunRecord

__all__ = [
    "ENV_MEMORY_DIR",
    "KEEP",
    "SHM",
    "Candidate",
    "MemoryStore",
    "MemoryTier",
    "memory_dir",
    "prepare",
    "remove_memory_dir",
]

ENV_MEMORY_DIR = "ACCEPTRUN_MEMORY_DIR"
SHM = Path("/dev/shm")
FALLBACK = "memory"  # the directory in the run record when there is no /dev/shm
PREFIX = "acceptrun-"
# Memory copies kept after a commit: the newest only. Host memory is the scarce thing here
# (a 70B model's state is ~1 TB); while one is written the previous one stays, so the peak
# is two copies, and a bad newest copy falls back to the durable store, not to an older one.
KEEP = 1

EventSink = Callable[[str, dict[str, Any]], None]

log = get_logger(__name__)


def prepare(record: RunRecord) -> Path:
    """The run's memory tier directory, for an attempt's environment (the supervisor).

    Made before the first attempt; that first time its place is recorded (a
    ``memory_tier`` event: path, shared, and the note when it is not in shared memory,
    which is also printed as a warning).
    """
    existed = any(p.is_dir() for p in _places(record.path, record.run_id, SHM))
    path, note = memory_dir(record.path, record.run_id)
    if not existed:
        fields: dict[str, Any] = {"path": str(path), "shared": note is None}
        if note is not None:
            fields["note"] = note
            log.warning(note)
        record.event("memory_tier", sync=True, **fields)
    return path


def _places(run_dir: Path, run_id: str, shm: Path) -> tuple[Path, Path]:
    """Where a run's memory tier may be: shared memory, or the record's fallback."""
    return shm / f"{PREFIX}{run_id}", run_dir / FALLBACK


def memory_dir(run_dir: Path, run_id: str, *, shm: Path = SHM) -> tuple[Path, str | None]:
    """The run's memory tier directory, created (mode 0700) when it is not there yet.

    Returns the directory and a note when it is not in shared memory: ``/dev/shm`` is
    missing, not writable or holds a name of the run's that is not this user's directory
    (then ``memory/`` in the run record serves: slower, on disk, but still outliving the
    workload). None is the note when all is as it should be.
    """
    wanted = shm / f"{PREFIX}{run_id}"
    problem = _unusable(shm, wanted)
    if problem is None:
        return wanted, None
    fallback = run_dir / FALLBACK
    fallback.mkdir(mode=0o700, exist_ok=True)
    note = (
        f"{problem}: the memory tier is kept in {fallback} instead, on the run record's "
        "disk (restores still skip the durable store's read, saves cost a disk write). "
        "Give the machine a /dev/shm (a tmpfs; Docker: --shm-size) to keep it in memory"
    )
    return fallback, note


def _unusable(shm: Path, wanted: Path) -> str | None:
    """Why ``wanted`` cannot be the tier's directory in ``shm``, or None once it is made."""
    if not shm.is_dir() or not os.access(shm, os.W_OK | os.X_OK):
        return f"{shm} is not a writable directory on this machine"
    try:
        wanted.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"{wanted} cannot be created ({exc.strerror or exc})"
    st = os.lstat(wanted)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return f"{wanted} exists and is not a directory of this user's"
    return None


def remove_memory_dir(run_dir: Path, run_id: str, *, shm: Path = SHM) -> list[Path]:
    """Remove the run's memory tier (at the run's close): the directories removed.

    Only a directory of this user's is removed (never through a link); what is not there
    is no error.
    """
    removed = []
    for path in _places(run_dir, run_id, shm):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class MemoryStore(CheckpointStore):
    """A checkpoint store in the memory tier: the store's layout, manifests and hashes.

    Its commits take no sequence number (a store's ``COMMITS`` log is read whole at each
    commit, and a memory tier commits every step); its order is the steps'.
    """

    sequenced = False

    def __init__(self, root: str | Path) -> None:
        super().__init__(root, keep_last=KEEP)


@dataclass
class Candidate:
    """The memory copy a restart may load, and what was passed over on the way."""

    info: CheckpointInfo | None
    expect: str | None = None  # the manifest's hash of the tensors, checked as they load
    rejected: list[str] = field(default_factory=list)  # why each copy passed over was


@dataclass
class _Figures:
    saves: int = 0
    adopted: int = 0
    stall_s: float = 0.0  # all the loop waited for memory saves, seconds
    stall_max_s: float = 0.0
    nbytes: int = 0  # one copy's tensor bytes
    last_step: int | None = None
    error: str | None = None


class MemoryTier:
    """The workload's side of the memory tier: save, adopt, pick the copy to restore.

    One save in flight at a time: :meth:`save` first waits for the previous one (normally
    long done; the wait is part of the stall it measures). A failure (a full ``/dev/shm``)
    turns the tier off for the rest of the attempt and is reported once through
    ``on_event`` (a ``memory_saves`` event with ``error``); it never fails the run.
    """

    def __init__(
        self, root: Path, *, overlap: bool = True, on_event: EventSink | None = None
    ) -> None:
        self.store = MemoryStore(root)
        self.overlap = overlap
        self.on_event = on_event or (lambda _kind, _fields: None)
        self.figures = _Figures()
        self._lock = threading.Lock()  # the store is not thread-safe: saves and adopts
        self._thread: threading.Thread | None = None
        self._buffers: Any = None  # staging.StagingBuffers, made on the first save
        self._pending_stall = 0.0  # an overlapped save's wait, reported by its copy
        self.store.remove_stale_staging()  # what a killed workload's save left

    @property
    def off(self) -> bool:
        """True once a save failed: the tier does nothing more in this attempt."""
        return self.figures.error is not None

    def save(
        self,
        step: int,
        objects: Mapping[str, Any],
        *,
        durable_step: int | None,
        metrics: Mapping[str, float] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> float:
        """Stage ``objects`` as the state after ``step`` and write it in the background.

        Returns the seconds the call blocked (the wait for the previous save, the host
        copy). ``durable_step``: the newest durable checkpoint this state builds on.
        """
        if self.off:
            return 0.0
        from acceptrun.checkpoint.staging import StagingBuffers, stage

        t0 = time.perf_counter()
        self.wait()
        if self._buffers is None:
            self._buffers = StagingBuffers()
        try:
            staged = stage(objects, buffers=self._buffers, defer=self.overlap)
        except Exception as exc:  # state that cannot be saved fails the durable save too
            self._fail(step, exc)
            return time.perf_counter() - t0
        stall = time.perf_counter() - t0
        copy = None
        if staged.pending:
            from acceptrun.checkpoint.overlap import Overlap

            copy = Overlap(step, stall, staged.nbytes, self._overlap_event)
            copy.arm()
        else:
            self._count(stall)
        doc = {**(meta or {}), "tier": "memory", "durable_step": durable_step}
        self._thread = threading.Thread(
            target=self._persist, args=(step, staged, copy, dict(metrics or {}), doc),
            name=f"acceptrun-memory-{step}", daemon=True,
        )  # fmt: skip
        self._thread.start()
        return stall

    def _overlap_event(self, _kind: str, fields: dict[str, Any]) -> None:
        """An overlapped save's copy ended: its stall (the call and any step's wait)."""
        self._count(float(fields.get("stall_s") or 0.0))

    def _count(self, stall: float) -> None:
        self.figures.stall_s += stall
        self.figures.stall_max_s = max(self.figures.stall_max_s, stall)

    def _persist(
        self, step: int, staged: Any, copy: Any, metrics: dict[str, float], meta: dict[str, Any]
    ) -> None:
        from acceptrun.checkpoint.staging import write_staged

        writer = None
        try:
            if copy is not None:
                copy.run(staged.copy_pending)
            with self._lock:
                writer = self.store.begin(step)
                write_staged(staged, writer)
                self.store.commit(writer, metrics=metrics, meta=meta)
            self.figures.saves += 1
            self.figures.nbytes = staged.nbytes
            self.figures.last_step = step
        except BaseException as exc:  # recorded; the run goes on without the tier
            staged.release()
            if writer is not None and writer.state == "open":
                with contextlib.suppress(OSError):
                    self.store.abort(writer)
            self._fail(step, exc)

    def adopt(self, info: CheckpointInfo, *, durable_step: int | None = None) -> None:
        """Copy the durable checkpoint ``info`` (just committed) in as the newest memory copy.

        The step where a durable save and a memory save fall together: the loop staged
        the state once (the durable save), and this copy runs on the durable save's
        background thread, from files the page cache still holds. Its hashes are
        computed again as it is written and must match the durable manifest's.
        """
        if self.off:
            return
        newest = self.figures.last_step
        if newest is not None and newest >= info.step:
            return  # a newer state is already here
        writer = None
        try:
            with self._lock:
                writer = self.store.begin(info.step)
                for rel in sorted(info.files):
                    with open(info.path / rel, "rb") as src, writer.open(rel) as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                files, _ = writer.written()
                differ = [r for r in files if files[r]["hash"] != info.files[r].get("hash")]
                if differ:
                    raise OSError(f"{differ} changed while copied from {info.path}")
                base = info.step if durable_step is None else durable_step
                meta = {**info.meta, "tier": "memory", "durable_step": base,
                        "adopted_from": str(info.path)}  # fmt: skip
                self.store.commit(writer, metrics=info.metrics, meta=meta)
            self.figures.adopted += 1
            self.figures.last_step = info.step
        except BaseException as exc:
            if writer is not None and writer.state == "open":
                with contextlib.suppress(OSError):
                    self.store.abort(writer)
            self._fail(info.step, exc)

    def _fail(self, step: int, exc: BaseException) -> None:
        if self.off:
            return
        self.figures.error = f"step {step}: {type(exc).__name__}: {exc}"
        self.on_event("memory_saves", self.report())

    def wait(self) -> None:
        """Wait for the memory save in flight, if any."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    def report(self) -> dict[str, Any]:
        """The tier's figures, for the ``memory_saves`` event: saves, stall, bytes, error."""
        f = self.figures
        out: dict[str, Any] = {
            "path": str(self.store.root), "saves": f.saves, "adopted": f.adopted,
            "stall_s": round(f.stall_s, 6), "stall_max_s": round(f.stall_max_s, 6),
            "bytes": f.nbytes, "last_step": f.last_step,
        }  # fmt: skip
        if f.error is not None:
            out["error"] = f.error
        return out

    def close(self) -> None:
        """Wait for the last save and report the figures (a ``memory_saves`` event)."""
        self.wait()
        if not self.off and (self.figures.saves or self.figures.adopted):
            self.on_event("memory_saves", self.report())

    def candidate(self, resume_step: int | None, *, defer: str | None = None) -> Candidate:
        """The memory copy to resume from instead of the durable ``resume_step``, if any.

        The newest memory copy is taken when it holds the step ``resume_step`` (None: no
        durable checkpoint) or a later one, and builds on it; it is verified (with ``defer``, a
        file name, that file only for presence and size: its hash comes back as
        ``expect`` for the loader to check as it reads). A copy that fails verification
        or belongs to an abandoned line (a rollback) is removed, and why is in
        ``rejected``.
        """
        out = Candidate(None)
        floor = -1 if resume_step is None else resume_step
        with self._lock:
            for info in sorted(self.store.list(), key=lambda i: i.step, reverse=True):
                why = _passed_over(info, floor)
                if why is None:
                    result = self.store.verify(info.step, defer=[defer] if defer else [])
                    if result.ok:
                        entry = info.files.get(defer) if defer and result.deferred else None
                        out.info, out.expect = info, (str(entry["hash"]) if entry else None)
                        return out
                    why = "failed verification: " + "; ".join(result.problems)
                if why != _OLDER:  # an older copy stays: a later save replaces it
                    out.rejected.append(f"memory copy of step {info.step} {why}")
                    self.drop(info)
        return out

    def drop(self, info: CheckpointInfo) -> None:
        """Remove a memory copy (bad, or of an abandoned line): memory is not evidence."""
        with contextlib.suppress(OSError):
            shutil.rmtree(info.path)
        if self.figures.last_step == info.step:
            self.figures.last_step = None


_OLDER = "is not newer than the durable checkpoint"


def _passed_over(info: CheckpointInfo, floor: int) -> str | None:
    """Why the memory copy ``info`` is not the one to resume from the durable ``floor``."""
    if info.step < floor:  # the same step is taken: the same state, read from memory
        return _OLDER
    base = info.meta.get("durable_step")
    if isinstance(base, int) and not isinstance(base, bool) and base > floor:
        return (
            f"builds on durable step {base}, newer than the resume point "
            f"({'none' if floor < 0 else f'step {floor}'}): a rollback abandoned it"
        )
    return None
