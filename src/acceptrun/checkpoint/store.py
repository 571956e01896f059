"""The checkpoint store: atomic checkpoint directories, manifests, verification, retention.

A store root holds::

    step-<N>/          one committed checkpoint: its files, then MANIFEST.json (written last)
    LATEST             "step-<N>\\n", replaced atomically after each commit
    quarantine/        checkpoints that failed verification or were replaced; never deleted
    COMMITS            one line per commit (sequence number, step), appended before it
    .staging-step-*    a save in progress (or left by a killed one)

A checkpoint exists only if ``step-<N>/MANIFEST.json`` parses. The manifest is written
last and the directory appears under its final name by one rename, so a reader sees a
whole checkpoint or none. Each commit also gets a sequence number, one more than any
before it (checkpoint/sequence.py): retention and resume take "newest" in that order,
which is the order the checkpoints were written even where their steps are not (a
watched script's counter that went back). Files are hashed as they are written, so a commit costs no
re-read; :meth:`CheckpointStore.verify` re-reads and re-hashes. One process writes to a
root at a time (the workload), any number read; a store is not thread-safe. In a run of
several processes rank 0 is that process: the other ranks write their own files into
its staging directory (:meth:`CheckpointStore.join`), and rank 0 adopts their hashes
(:meth:`CheckpointWriter.adopt`) and commits once all have written. A save in progress
is a :class:`~acceptrun.checkpoint.writer.CheckpointWriter` (checkpoint/writer.py).

>>> store = CheckpointStore("ckpt", keep_last=2)
>>> w = store.begin(100)
>>> w.write_bytes("model.safetensors", blob)
>>> store.commit(w, metrics={"loss": 1.25}).step
100
"""

from __future__ import annotations

import builtins
import contextlib
import json
import math
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from acceptrun._util.durable import fsync_dir, loads_json, read_bytes_bounded, write_atomic
from acceptrun._util.hashing import ALGORITHM, hash_bytes, hash_file, split_hash
from acceptrun.checkpoint.sequence import CommitLog, true_order
from acceptrun.checkpoint.writer import MANIFEST, CheckpointWriter, valid_name
from acceptrun.errors import AcceptrunValueError, RecordError, UserError
from acceptrun.record.workspace import now_iso

__all__ = [
    "LATEST",
    "MANIFEST",  # the commit marker's name (declared beside the writer, which may not take it)
    "QUARANTINE",
    "CheckpointInfo",
    "CheckpointStore",
    "VerifyResult",
]

LATEST = "LATEST"
QUARANTINE = "quarantine"
KIND = "acceptrun.checkpoint"
SCHEMA = 1
_REQUIRED = ("kind", "schema", "step", "created_at", "files", "total_bytes", "metrics", "meta")
# "digest" (since 0.x): the hash of the manifest's own text without it, so a flipped byte
# in the metrics, meta or times of a manifest is caught like one in a tensor file.
_KNOWN_KEYS = frozenset((*_REQUIRED, "algorithm", "digest", "sequence"))
_STEP_DIR = re.compile(r"step-(0|[1-9][0-9]*)")
# What a killed writer leaves, named with its pid: a save, a retention delete, and
# write_atomic's temporary LATEST.
_LEFTOVER = re.compile(r"\.(?:staging-step-\d+|deleting-step-\d+|LATEST\.tmp)-(\d+)-[0-9a-f]+")
_NEW_SEQUENCE = -1  # _commit's sequence: the next one (a re-date passes its own, or None)

EventSink = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint as its manifest describes it (nothing re-hashed)."""

    step: int
    path: Path
    created_at: str
    files: dict[str, dict[str, Any]]  # relative path -> {"size": bytes, "hash": "xxh3_128:..."}
    total_bytes: int
    metrics: dict[str, float]
    meta: dict[str, Any]
    sequence: int | None = None  # the commit's place in the store's order (sequence.py)


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of re-reading a checkpoint; each problem names the file and the fault."""

    ok: bool
    step: int | None
    path: Path
    problems: list[str]
    seconds: float
    checked_bytes: int
    # Files checked for presence and size only, their hash left to the reader that reads
    # them anyway (verify(defer=...)): "ok" holds for the rest.
    deferred: tuple[str, ...] = ()

    def raise_for_problems(self) -> None:
        """Raise :class:`RecordError` when the checkpoint failed verification."""
        if not self.ok:
            raise RecordError(
                f"checkpoint {self.path} failed verification: {'; '.join(self.problems)}. "
                "Resume from CheckpointStore.latest_verified() or restore a mirrored copy."
            )


def _step_of(name: str) -> int | None:
    match = _STEP_DIR.fullmatch(name)
    return int(match.group(1)) if match else None


class CheckpointStore:
    """The checkpoints of one run under ``root``: commit, verify, quarantine, retention.

    The newest ``keep_last`` are always kept; 1 is allowed here but unsafe (if the only
    recent checkpoint fails verification there is nothing to fall back to), so the spec
    layer asks for 2 or more. ``keep_every`` also keeps multiples of that step;
    ``keep_best=("loss", "min")`` keeps the best by a committed metric. ``on_event`` gets
    ``(kind, fields)`` for checkpoint_commit, checkpoint_quarantine, checkpoint_delete and
    checkpoint_staging_removed, for the run's events.jsonl; it should not raise.
    """

    sequenced: ClassVar[bool] = True
    """Each commit takes a sequence number (checkpoint/sequence.py)."""

    def __init__(
        self,
        root: str | Path,
        *,
        keep_last: int = 2,
        keep_every: int | None = None,
        keep_best: tuple[str, str] | None = None,
        on_event: EventSink | None = None,
    ) -> None:
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise AcceptrunValueError(
                f"keep_last must be an integer >= 1 (2 is safe), got {keep_last!r}"
            )
        if keep_every is not None and (not isinstance(keep_every, int) or keep_every < 1):
            raise AcceptrunValueError(
                f"keep_every must be None or an integer >= 1, got {keep_every!r}"
            )
        if keep_best is not None and (len(keep_best) != 2 or keep_best[1] not in ("min", "max")):
            raise AcceptrunValueError(
                f"keep_best must be (metric, 'min' | 'max'), got {keep_best!r}"
            )
        self.root = Path(root)
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.keep_best = keep_best
        self._on_event = on_event
        self._listeners: builtins.list[EventSink] = []  # see subscribe()
        self._active: set[Path] = set()  # staging dirs of this store's open writers

    def begin(self, step: int) -> CheckpointWriter:
        """Start the save of ``step`` in a fresh staging directory."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise UserError(f"checkpoint step must be an integer >= 0, got {step!r}")
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f".staging-step-{step}-{os.getpid()}-{secrets.token_hex(4)}"
        path.mkdir()
        self._active.add(path)
        return CheckpointWriter(self, step, path)

    def join(self, step: int, path: str | Path) -> CheckpointWriter:
        """A writer for one rank's files in a save another process began (its staging dir).

        The joined writer cannot commit and its abort leaves the directory to the owner,
        which commits or aborts the whole save.
        """
        path = Path(path)
        match = _LEFTOVER.fullmatch(path.name)
        if (
            path.parent != self.root
            or not match
            or not path.name.startswith(f".staging-step-{step}-")
        ):
            raise UserError(f"{path} is not a staging directory of step {step} in {self.root}")
        if not path.is_dir():
            raise UserError(
                f"{path} does not exist on this machine: the save of step {step} was abandoned, "
                f"or {self.root} is not one file system that every node sees. Ranks write into "
                "the staging directory rank 0 began, so a run across nodes needs a shared "
                "checkpoint directory: the record on a shared volume, or checkpoint.dir on "
                "NFS, Lustre or EFS"
            )
        return CheckpointWriter(self, step, path, owner=False)

    def commit(
        self,
        writer: CheckpointWriter,
        *,
        metrics: Mapping[str, float] | None = None,
        meta: Mapping[str, Any] | None = None,
        retain: bool = True,
    ) -> CheckpointInfo:
        """Make the save durable and visible as ``step-<N>``, point LATEST at it, prune.

        Bad ``metrics``/``meta`` (not strict JSON: NaN, objects) or a file put in the
        staging directory around the writer raise :class:`UserError` and leave the writer
        open (fix and commit again, or abort); a failure while committing abandons it.
        ``retain=False`` leaves the pruning to the caller (:meth:`apply_retention`), who
        runs it once whoever waits for the commit has been told: deleting a retired
        checkpoint is housekeeping, not part of making this one durable.
        """
        sequence = _NEW_SEQUENCE if self.sequenced else None
        info = self._commit(writer, metrics=metrics, meta=meta, sequence=sequence)
        # Last: a crash before or during it leaves extra checkpoints, never too few.
        if retain:
            self.apply_retention()
        return info

    def _commit(
        self,
        writer: CheckpointWriter,
        *,
        metrics: Mapping[str, float] | None,
        meta: Mapping[str, Any] | None,
        created_at: str | None = None,
        latest: bool = True,
        event: Mapping[str, Any] | None = None,
        sequence: int | None = _NEW_SEQUENCE,
    ) -> CheckpointInfo:
        if writer.store is not self or not writer.owner:
            raise UserError(f"the save of step {writer.step} was begun by another store")
        writer.require_open()
        stray = sorted(set(self._walk_files(writer.path)) - set(writer.files))
        if stray:
            raise UserError(
                f"files {stray} were put in {writer.path} without writer.open(), so they "
                "have no hash; write them with writer.open() or writer.write_bytes()"
            )
        manifest = {
            "kind": KIND,
            "schema": SCHEMA,
            "step": writer.step,
            "created_at": created_at or now_iso(),
            "algorithm": ALGORITHM,
            "files": writer.files,
            "total_bytes": sum(f["size"] for f in writer.files.values()),
            "metrics": {str(k): float(v) for k, v in (metrics or {}).items()},
            "meta": dict(meta or {}),
        }
        log = CommitLog(self.root)
        if sequence == _NEW_SEQUENCE:
            sequence = log.next_sequence(i.sequence for i in self.list())
        if sequence is not None:
            manifest["sequence"] = sequence
        try:  # strict JSON, so that any tool can read a manifest
            manifest["digest"] = hash_bytes(_manifest_text(manifest).encode())
            text = _manifest_text(manifest)
        except (TypeError, ValueError) as exc:
            raise UserError(f"checkpoint metrics/meta of step {writer.step}: {exc}") from exc
        final = self.root / f"step-{writer.step}"
        try:
            # Subdirectories deepest first, so every name a manifest lists is durable
            # before the manifest is: a manifest that survives a power cut never lists a
            # file that did not.
            for d in sorted(writer.dirs, key=lambda p: len(p.parts), reverse=True):
                fsync_dir(d)
            write_atomic(writer.path / MANIFEST, text, raw=True)  # last; its digest covers the text
            if sequence is not None:  # before the rename: a step in the store is in the log
                log.append(sequence, writer.step)
            if final.exists():
                self._set_aside(final)
            os.rename(writer.path, final)  # the commit point: the whole checkpoint appears
        except BaseException:
            self.abort(writer)
            raise
        writer.state = "committed"
        self._active.discard(writer.path)
        # The rename is made durable before LATEST names it, or a power cut could leave
        # LATEST pointing at a directory that never reached the disk.
        fsync_dir(self.root)
        if latest:
            write_atomic(self.root / LATEST, f"{final.name}\n")
        info = self._load(final)[0]
        assert info is not None, f"{final} was committed but its manifest does not load"
        seconds = round(time.monotonic() - writer.started, 6)  # begin to commit: the stall
        fields = {"step": info.step, "path": str(final), "total_bytes": info.total_bytes}
        fields |= {"files": len(info.files), "seconds": seconds, **(event or {})}
        self._emit("checkpoint_commit", fields)
        return info

    def redate(self, step: int, new_step: int, *, meta: Mapping[str, Any]) -> CheckpointInfo:
        """Store the checkpoint of ``step`` again as ``new_step``: its step was an estimate.

        ``new_step == step``: the estimate proved right; the manifest is replaced (one
        rename) by one with ``meta`` merged, and nothing else changes.

        A watched checkpoint is dated by the steps its script reported before the file was
        written; a source that reaches the disk late (a SummaryWriter flushes every two
        minutes) can prove the step only after the capture. The files are hard-linked
        (copied and re-hashed where the file system cannot link) into a save of
        ``new_step`` with the same hashes, metrics and commit time, ``meta`` merged into
        its meta; that save is committed (a ``checkpoint_commit`` with ``redated_from``),
        then ``step-<step>`` is removed (a ``checkpoint_delete`` with ``redated_to``). A
        crash in between leaves both: one checkpoint too many, never none. LATEST
        follows when it named ``step``, and the sequence number goes with the checkpoint
        (its place in the store's order does not change). ``new_step`` must not be
        :meth:`taken`: a step a deleted checkpoint held is never used again.
        """
        info = self.get(step)
        if info is None:
            raise UserError(f"{self.root}: no committed checkpoint of step {step} to re-date")
        if new_step == step:  # the estimate proven right: only its manifest's meta changes
            doc = loads_json(read_bytes_bounded(info.path / MANIFEST))
            doc["meta"] = {**info.meta, **meta}
            doc.pop("digest", None)
            doc["digest"] = hash_bytes(_manifest_text(doc).encode())
            write_atomic(info.path / MANIFEST, _manifest_text(doc), raw=True)  # old or new
            new = self._load(info.path)[0]
            assert new is not None, f"{info.path}: its manifest does not load after the change"
            return new
        if (self.root / f"step-{new_step}").exists() or self.taken(new_step):
            raise UserError(
                f"{self.root}: step {new_step} is held by another checkpoint (or was, before "
                f"retention deleted it), so the checkpoint of step {step} keeps its step"
            )
        latest = self._latest_name() == info.path.name
        writer = self.begin(new_step)
        try:
            for rel, entry in sorted(info.files.items()):
                for parent in reversed(PurePosixPath(rel).parents[:-1]):
                    if not (writer.path / parent).is_dir():
                        (writer.path / parent).mkdir()
                        writer.dirs.add(writer.path / parent)
                source, target = info.path / rel, writer.path / rel
                try:
                    os.link(source, target)  # the same bytes: nothing to hash again
                    continue
                except OSError:
                    pass  # a file system without hard links: a copy, hashed again
                shutil.copyfile(source, target)
                digest = hash_file(target, split_hash(str(entry["hash"]))[0])[0]
                if digest != entry["hash"]:
                    raise RecordError(
                        f"{source}: its copy hashes to {digest}, the manifest says "
                        f"{entry['hash']}; step {step} keeps its step (verify it)"
                    )
                with open(target, "rb") as f:
                    os.fsync(f.fileno())
            writer.adopt(info.files, [])
        except BaseException:
            self.abort(writer)
            raise
        new = self._commit(
            writer, metrics=info.metrics, meta={**info.meta, **meta},
            created_at=info.created_at, latest=latest, event={"redated_from": step},
            sequence=info.sequence,
        )  # fmt: skip
        reason = f"re-dated as step {new_step}"
        self._delete(info, {"step": step, "reason": reason, "redated_to": new_step})
        self.apply_retention()
        return new

    def taken(self, step: int) -> bool:
        """Whether ``step`` is held, or was by a checkpoint deleted or quarantined since.

        A step a re-date moved a checkpoint away from is free again (sequence.py).
        """
        if (self.root / f"step-{step}").exists():
            return True
        return step in CommitLog(self.root).read().values()

    def next_free_step(self) -> int:
        """One more than any step held now or ever committed in this store (1 if none)."""
        steps = [*CommitLog(self.root).read().values(), *(i.step for i in self.list())]
        return max(steps, default=0) + 1

    def abort(self, writer: CheckpointWriter) -> None:
        """Abandon a save and remove its staging directory; aborting twice is harmless."""
        if writer.state == "committed":
            raise UserError(f"the save of step {writer.step} is committed; it cannot be aborted")
        writer.state = "aborted"
        if not writer.owner:
            return  # the owner of the save removes it
        self._active.discard(writer.path)
        shutil.rmtree(writer.path, ignore_errors=True)

    def _set_aside(self, final: Path) -> None:
        # A re-save of a step (a resume that repeats it). A directory cannot be replaced by
        # one rename, so step-<N> is briefly absent; if LATEST names it, point LATEST at
        # the newest older checkpoint first, so a crash then still finds a whole one.
        if self._latest_name() == final.name:
            older = [i for i in self.list() if i.step < (_step_of(final.name) or 0)]
            if older:
                write_atomic(self.root / LATEST, f"{older[-1].path.name}\n")
            else:
                self._remove_latest()
        self.quarantine(final, "replaced by a new save of the same step")

    def list(self) -> list[CheckpointInfo]:
        """Committed checkpoints (manifest parses), lowest step first. Hashes nothing.

        Lowest step is not always oldest: :meth:`ordered` gives the order of the commits.
        """
        infos = []
        if self.root.is_dir():
            for entry in self.root.iterdir():
                if _step_of(entry.name) is not None and (info := self._load(entry)[0]):
                    infos.append(info)
        return sorted(infos, key=lambda i: i.step)

    def ordered(self) -> builtins.list[CheckpointInfo]:
        """Committed checkpoints oldest commit first (their sequence numbers; sequence.py)."""
        return true_order(self.list())

    def get(self, step: int) -> CheckpointInfo | None:
        """The committed checkpoint of ``step``, or None."""
        return self._load(self.root / f"step-{step}")[0]

    def latest(self) -> CheckpointInfo | None:
        """The LATEST target if its manifest parses, else the newest commit."""
        name = self._latest_name()
        info = self._load(self.root / name)[0] if name else None
        infos = [] if info else self.ordered()
        return info or (infos[-1] if infos else None)

    def verify(
        self, step: int | None = None, *, defer: Iterable[str] | Callable[[str], bool] = ()
    ) -> VerifyResult:
        """Re-read and re-hash every file of ``step`` (None: the LATEST target, else newest).

        Missing, resized, changed and unexpected files are problems. An unexpected file
        (say a planted ``evil.pkl``) is never loaded by acceptrun, but it means the
        directory is not what was committed.

        ``defer`` names files whose hash the caller checks itself while it reads them (a
        restore hashes the tensors as it loads them, so the bytes are read once): they are
        checked for presence and size here, and listed in the result's ``deferred``; a
        callable says it of each name, as :meth:`latest_verified`'s ``defer``.
        """
        name = self._latest_name()
        if step is not None:
            path = self.root / f"step-{step}"
        elif name and (self.root / name).is_dir():
            path = self.root / name
        elif infos := self.ordered():
            path = infos[-1].path
        else:
            return VerifyResult(False, None, self.root, [f"{self.root}: no checkpoint"], 0, 0)
        deferred = defer if callable(defer) else frozenset(defer).__contains__
        return self._verify_dir(path, defer=deferred)[0]

    def latest_verified(
        self,
        *,
        quarantine: bool = True,
        defer: Callable[[str], bool] | None = None,
        skip: Collection[int] = (),
    ) -> CheckpointInfo | None:
        """The newest checkpoint that verifies: the one to resume from, or None.

        Tries the LATEST target, then older ones. With ``quarantine`` each one that fails
        is moved to ``quarantine/`` (a checkpoint_quarantine event) and LATEST is repointed
        at the good one (removed if none); without it nothing on disk changes.

        ``defer`` says which files (by manifest name) the caller hashes itself as it reads
        them (checked here for presence and size only, as :meth:`verify`'s ``defer``);
        ``skip`` the steps not to try (ones the caller found bad without quarantining).
        """
        name = self._latest_name()
        candidates = [self.root / name] if name and (self.root / name).is_dir() else []
        order = [i.path for i in self.ordered()]
        if candidates and candidates[0] in order:  # then the ones committed before it
            order = order[: order.index(candidates[0])]
        candidates += reversed(order)
        candidates = [p for p in candidates if _step_of(p.name) not in skip]
        # LATEST names one moved away (a caller's quarantine): repointed as if moved here
        moved = quarantine and bool(name) and not (self.root / str(name)).is_dir()
        for path in candidates:
            result, info = self._verify_dir(path, defer=defer)
            if info is not None and result.ok:
                if moved:
                    write_atomic(self.root / LATEST, f"{path.name}\n")
                return info
            if quarantine:
                self.quarantine(path, "failed verification: " + "; ".join(result.problems))
                moved = True
        if moved:
            self._remove_latest()
        return None

    def quarantine(self, path: Path, reason: str) -> Path:
        """Move a checkpoint directory to ``quarantine/<name>-<UTC stamp>/`` with REASON.txt.

        Never a delete: a bad checkpoint is evidence, and a "bad" verdict can be wrong (a
        mount that was briefly unreadable).
        """
        path = Path(path)
        if path.parent.resolve() != self.root.resolve() or not path.is_dir():
            raise UserError(f"{path} is not a checkpoint directory of {self.root}")
        qdir = self.root / QUARANTINE
        qdir.mkdir(exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        dest, n = qdir / f"{path.name}-{stamp}", 1
        while dest.exists():
            n += 1
            dest = qdir / f"{path.name}-{stamp}-{n}"
        os.rename(path, dest)
        fsync_dir(qdir)
        fsync_dir(self.root)
        write_atomic(dest / "REASON.txt", f"{reason}\nquarantined_at: {now_iso()}\nfrom: {path}\n")
        fields = {"step": _step_of(path.name), "path": str(path), "to": str(dest)}
        self._emit("checkpoint_quarantine", {**fields, "reason": reason})
        return dest

    def retained_steps(self, infos: builtins.list[CheckpointInfo] | None = None) -> set[int]:
        """The steps retention keeps, computed without deleting anything (``acceptrun gc``)."""
        infos = true_order(self.list() if infos is None else infos)
        steps = [i.step for i in infos]  # oldest commit first
        keep = set(steps[-self.keep_last :])
        if self.keep_every:
            keep |= {s for s in steps if s % self.keep_every == 0}
        if self.keep_best:
            metric, mode = self.keep_best
            sign = 1.0 if mode == "min" else -1.0
            scored = [(sign * i.metrics[metric], -i.step) for i in infos if metric in i.metrics]
            scored = [s for s in scored if math.isfinite(s[0])]
            if scored:
                keep.add(-min(scored)[1])  # on a tie, the newer checkpoint
        pinned = _step_of(self._latest_name() or "")
        if pinned in steps:  # the resume point, and whatever was committed after it
            keep |= set(steps[steps.index(pinned) :])
        elif pinned is not None:  # it names one moved away: keep what a resume may reach
            keep |= {s for s in steps if s >= pinned}
        return keep

    def apply_retention(self) -> builtins.list[int]:
        """Delete the committed checkpoints no rule keeps; returns the steps deleted.

        Kept: the newest ``keep_last`` commits (the store's order, not the steps':
        sequence.py), multiples of ``keep_every``, the best by ``keep_best`` (checkpoints
        without that metric are not candidates), the LATEST target and anything committed
        after it. Directories without a valid manifest are not touched.
        A delete that fails is reported (checkpoint_delete with "error") and skipped: a
        failed purge must never fail the save that triggered it.
        """
        infos = self.list()
        keep = self.retained_steps(infos)
        reason = f"retention: not among the newest {self.keep_last}"
        if self.keep_every:
            reason += f", not a multiple of {self.keep_every}"
        if self.keep_best:
            reason += f", not the best {self.keep_best[0]}"
        deleted = []
        for info in (i for i in infos if i.step not in keep):
            if self._delete(info, {"step": info.step, "reason": reason}):
                deleted.append(info.step)
        return deleted

    def _delete(self, info: CheckpointInfo, fields: dict[str, Any]) -> bool:
        """Delete a committed checkpoint (a checkpoint_delete event with ``fields``).

        Rename first: a crash mid-rmtree then leaves a ".deleting-" directory, never a
        step-<N> whose manifest survives while its files are half gone. A failure is
        recorded in the event ("error") and returned as False, never raised.
        """
        tomb = self.root / f".deleting-{info.path.name}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.rename(info.path, tomb)
            fsync_dir(self.root)
            shutil.rmtree(tomb)
        except OSError as exc:
            fields["error"] = str(exc)
        self._emit("checkpoint_delete", fields)
        return "error" not in fields

    def remove_stale_staging(self) -> builtins.list[Path]:
        """Remove what killed writers left: staging and ``.deleting-`` dirs, temp LATESTs.

        A leftover is stale when the pid in its name is not alive, or is this process's
        own pid with no open writer of this store (containers reuse pids on restart). Call
        it once when a writer attaches to a root. A reaped pid is dead; a zombie is not.
        """
        removed: builtins.list[Path] = []
        for entry in sorted(self.root.iterdir()) if self.root.is_dir() else []:
            match = _LEFTOVER.fullmatch(entry.name)
            if not match or entry in self._active:
                continue
            pid = int(match.group(1))
            if pid != os.getpid() and _pid_alive(pid):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
            self._emit("checkpoint_staging_removed", {"path": str(entry), "pid": pid})
        return removed

    def subscribe(self, listener: EventSink) -> None:
        """Also call ``listener(kind, fields)`` for each event, after ``on_event``.

        The checkpointer hands retention's deletions to the mirror this way.
        """
        self._listeners.append(listener)

    def _emit(self, kind: str, fields: dict[str, Any]) -> None:
        if self._on_event is not None:
            self._on_event(kind, fields)
        for listener in self._listeners:
            listener(kind, fields)

    def _latest_name(self) -> str | None:
        try:
            name = (self.root / LATEST).read_text(encoding="utf-8").strip()
        except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
            return None
        return name if _STEP_DIR.fullmatch(name) else None

    def _remove_latest(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.root / LATEST).unlink()
            fsync_dir(self.root)

    @staticmethod
    def _walk_files(path: Path) -> Iterator[str]:
        """Relative names of every non-directory entry under ``path`` but the manifest."""
        for dirpath, dirnames, filenames in os.walk(path):
            links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
            for n in filenames + links:
                rel = Path(dirpath, n).relative_to(path).as_posix()
                if rel != MANIFEST:
                    yield rel

    def _load(self, path: Path) -> tuple[CheckpointInfo | None, str | None]:
        """Parse and check ``path/MANIFEST.json``: (info, None), or (None, the problem)."""
        where = f"{path.name}/{MANIFEST}"
        try:
            raw = read_bytes_bounded(path / MANIFEST)
            doc = loads_json(raw)  # too deep or too large: not valid JSON, like a bad hash
        except (FileNotFoundError, NotADirectoryError):
            return None, f"{where}: missing (the save never finished, or it was removed)"
        except OSError as exc:
            return None, f"{where}: unreadable ({exc.strerror})"
        except ValueError as exc:
            return None, f"{where}: not valid JSON ({exc})"
        if not isinstance(doc, dict) or doc.get("kind") != KIND:
            kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
            return None, f"{where}: not a checkpoint manifest (kind {kind!r}, expected {KIND!r})"
        if missing := [k for k in _REQUIRED if k not in doc]:
            return None, f"{where}: missing keys {missing}"
        if doc["schema"] != SCHEMA:
            return None, f"{where}: schema {doc['schema']!r} is not supported (expected {SCHEMA})"
        if "digest" in doc and (problem := _digest_problem(doc, raw)):
            return None, f"{where}: {problem}"
        if type(doc["step"]) is not int or _step_of(path.name) not in (None, doc["step"]):
            return None, f"{where}: step {doc['step']!r} does not match the directory name"
        files, metrics, meta = doc["files"], doc["metrics"], doc["meta"]
        if not (isinstance(files, dict) and isinstance(metrics, dict) and isinstance(meta, dict)):
            return None, f"{where}: 'files', 'metrics' and 'meta' must be objects"
        for rel, entry in files.items():  # a name like "../x" would make verify read outside
            if not (valid_name(rel) and isinstance(entry, dict) and type(entry.get("size")) is int):
                return None, f"{where}: bad entry for file {rel!r}"
        created, total, seq = str(doc["created_at"]), doc["total_bytes"], doc.get("sequence")
        if seq is not None and (type(seq) is not int or seq < 1):
            return None, f"{where}: sequence {seq!r} is not a whole number >= 1"
        info = CheckpointInfo(doc["step"], path, created, files, total, metrics, meta, seq)
        return info, None

    def _verify_dir(
        self, path: Path, *, defer: Callable[[str], bool] | None = None
    ) -> tuple[VerifyResult, CheckpointInfo | None]:
        started, step = time.monotonic(), _step_of(path.name)
        if not path.is_dir():
            gone = f"{path.name}: no such checkpoint directory in {self.root}"
            return VerifyResult(False, step, path, [gone], 0.0, 0), None
        info, problem = self._load(path)
        problems = [problem] if problem else []
        checked = 0
        listed = info.files if info else {}
        for rel, entry in sorted(listed.items()):
            where = f"{path.name}/{rel}"
            try:
                st = os.lstat(path / rel)
            except (FileNotFoundError, NotADirectoryError):
                problems.append(f"{where}: missing")
                continue
            if not stat.S_ISREG(st.st_mode):
                problems.append(f"{where}: not a regular file")
                continue
            if st.st_size != entry["size"]:
                problems.append(
                    f"{where}: wrong size ({st.st_size} bytes, manifest {entry['size']})"
                )
                continue
            if defer is not None and defer(rel):
                continue
            try:  # each hash names its algorithm, so older manifests stay checkable
                digest, size = hash_file(path / rel, split_hash(str(entry.get("hash")))[0])
            except (OSError, ValueError) as exc:
                problems.append(f"{where}: could not hash ({exc})")
                continue
            checked += size
            if digest != entry["hash"]:
                problems.append(f"{where}: wrong hash ({digest}, manifest {entry['hash']})")
        if info is not None:  # without a manifest every file is "unexpected": say it once
            for rel in sorted(set(self._walk_files(path)) - set(listed)):
                problems.append(f"{path.name}/{rel}: unexpected file, not in the manifest")
        seconds = time.monotonic() - started
        deferred = tuple(sorted(r for r in listed if defer is not None and defer(r)))
        return VerifyResult(not problems, step, path, problems, seconds, checked, deferred), info


def _manifest_text(manifest: Mapping[str, Any]) -> str:
    """The one way a manifest is written: sorted keys, indented, strict JSON, a newline."""
    return json.dumps(manifest, indent=2, sort_keys=True, allow_nan=False) + "\n"


def _digest_problem(doc: dict[str, Any], raw: bytes) -> str | None:
    """Why a manifest with a ``digest`` is not the one committed, or None when it is."""
    if unknown := sorted(set(doc) - _KNOWN_KEYS):
        return f"unknown keys {unknown} (edited or corrupted)"
    body = {k: v for k, v in doc.items() if k != "digest"}
    try:
        expected = hash_bytes(_manifest_text(body).encode(), split_hash(str(doc["digest"]))[0])
        canonical = _manifest_text(doc).encode()
    except (TypeError, ValueError) as exc:
        return f"digest {doc['digest']!r} cannot be checked ({exc})"
    if expected != doc["digest"]:
        return f"content does not match its digest {doc['digest']!r} (edited or corrupted)"
    if canonical != raw:  # same content, other bytes: whitespace or escapes were changed
        return "bytes differ from the committed text (edited or corrupted)"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True
