"""Watched checkpoints: a script's own checkpoint files become acceptrun checkpoints.

A script that saves its own checkpoint (``torch.save(ckpt, "out/ckpt.pt")`` in place, a
Hugging Face ``output/checkpoint-500/`` directory) names it in ``checkpoint.watch``. For
each attempt the supervisor runs a :class:`CheckpointWatcher` on a thread of its own:

- it polls the globs; a match that is new or rewritten is **complete** when no process of
  the attempt's tree has any of its files open for writing (so a ``torch.save`` rewriting
  the path in place is never copied half-written) and either its format proves it whole
  (checkpoint/formats.py: a zip such as ``torch.save``'s with its central directory, a
  safetensors or ``.npy`` file whose header matches its size, JSON that parses; a file, at
  once, however often it is rewritten) or its size and mtime (a directory: every file's)
  held for ``checkpoint.settle``. A file rewritten again and again without ever holding
  still for ``settle``, in a format that proves nothing, is said once
  (``checkpoint_not_settling``, with the interval seen and the fix);
- it copies it into the run's :class:`~acceptrun.checkpoint.store.CheckpointStore` with
  :func:`~acceptrun.checkpoint.files.capture` (hashed while written, fsynced, manifest
  last), on the watcher thread: the workload is another process and never waits for it
  (its stall is 0). A copy whose source changed meanwhile is dropped and tried again
  once the file settles anew;
- the capture's step is the last integer in the match's name (``checkpoint-500`` -> 500,
  ``epoch=3-step=900.ckpt`` -> 900; on the run's axis when the script's counter started
  again after a resume, supervisor/axis.py); else the newest step the attempt reported before
  the file's mtime (step events of the client or of ``progress.pattern``: never later
  than the step the file holds, so lost work is never under-counted); else the step
  the attempt resumed from; else one past every step the store has used. A step is
  never reused for other content, even after retention deleted its checkpoint
  (:meth:`~acceptrun.checkpoint.store.CheckpointStore.taken`): the same content is
  skipped, other content is numbered past every step the store has used;
- a capture dated by an estimate (TensorBoard's scalars reach the disk late) is dated
  again once a later step proves it, in a chain where a newer capture still holds its
  step (supervisor/dating.py, which dates every capture); the store keeps the captures in the order
  they were committed (checkpoint/sequence.py), which retention and resume follow;
- at the end of the attempt a final pass captures a checkpoint written just before the
  exit: any, when the workload exited by itself (a status, not a signal); after a kill or
  a crash, only one whose format proves it whole (a directory: every file, and at least
  the files of the directory captured before it), and the capture event names the test
  (``complete_by``). A file that proves nothing, left by a process killed mid-write, is
  never trusted, and an event says what was left out.

On a restart :func:`restore_watched` puts the newest verified captured checkpoint back
where the script expects it before the command starts, and :func:`with_resume_args`
adds ``checkpoint.resume_args`` ("{checkpoint}" = the restored path) to the argv.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import psutil

from acceptrun._util.hashing import hash_file, split_hash
from acceptrun._util.paths import confine, lexical_problem
from acceptrun.checkpoint.files import SourceChanged, capture, put_back, sources_of
from acceptrun.checkpoint.formats import whole, whole_dir
from acceptrun.checkpoint.leftovers import watched_matches
from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore
from acceptrun.errors import AcceptrunError, UserError
from acceptrun.record.workspace import RunRecord
from acceptrun.supervisor.axis import StepAxis
from acceptrun.supervisor.dating import CaptureDating

if TYPE_CHECKING:
    pass

__all__ = [
    "CheckpointWatcher",
    "restore_for_attempt",
    "restore_watched",
    "with_resume_args",
]

PLACEHOLDER = "{checkpoint}"
_WRITE_MODES = ("w", "a", "+")  # psutil open_files() modes that can change the file
_LAST_INT = re.compile(r"(\d+)(?!.*\d)")
EventSink = Callable[[str, dict[str, Any]], None]


def with_resume_args(argv: Sequence[str], spec: Any, checkpoint: str) -> list[str]:
    """``argv`` with ``checkpoint.resume_args`` appended, "{checkpoint}" replaced.

    A list command gets them as words; a string command (``/bin/sh -c LINE``) gets them
    shell-quoted at the end of LINE. Under torchrun the script's arguments come last,
    so the script gets them, not torchrun.
    """
    args = [a.replace(PLACEHOLDER, checkpoint) for a in spec.checkpoint.resume_args]
    out = list(argv)
    if not args:
        return out
    if spec.shell and len(out) == 3 and out[:2] == ["/bin/sh", "-c"]:
        out[2] = f"{out[2]} {shlex.join(args)}"
        return out
    return [*out, *args]


def restore_watched(info: CheckpointInfo, workdir: Path) -> Path | None:
    """Put a captured checkpoint back where the script expects it; the restored path.

    Every name goes back under the current workdir (a record resumed on another machine)
    at the path it was captured from, relative to the workdir; a name the manifest gives
    no such path for, or whose path leads out (``..``, a symlinked folder planted since
    the capture), is refused: a restore writes a whole checkpoint, and a checkpoint's
    metadata never chooses where outside the workdir that happens. A symlink at the
    target itself is replaced, never followed. None for a checkpoint written by the
    client API (nothing to put back).
    """
    listing = sources_of(info)
    if not listing:
        return None
    rel = info.meta.get("watched_relative") or {}
    fix = "remove what leads out of the workdir (a symlink put there?) and resume again"
    targets: dict[str, Path] = {}
    for name in listing:
        where = rel.get(name) if isinstance(rel, dict) else None
        if not isinstance(where, str) or not where.strip("/."):
            raise UserError(
                f"restore of checkpoint {name!r} refused: step {info.step} names no path "
                "inside the workdir for it; resume from another step or capture it again"
            )
        why = lexical_problem(where)
        if why is not None:
            raise UserError(
                f"restore of checkpoint {name!r} refused: step {info.step} names {where!r}, "
                f"not a path inside the workdir ({why}); resume from another step"
            )
        # The folder is confined (symlinks resolved); the last part is replaced by rename.
        parent = PurePosixPath(where).parent
        folder = confine(workdir, str(parent), field=f"restore of checkpoint {name!r}", fix=fix)
        targets[name] = folder / PurePosixPath(where).name
    placed = put_back(info, targets)
    return next(iter(placed.values()))


def restore_for_attempt(
    record: RunRecord, spec: Any, store: CheckpointStore, attempt: int, resume_step: int | None
) -> str | None:
    """Put the attempt's resume checkpoint back where the script expects it, if it was
    captured; a ``restored`` event. The restored file or directory ("{checkpoint}" in
    checkpoint.resume_args), or None (nothing watched, or the client's own checkpoint)."""
    if resume_step is None or not spec.checkpoint.watch:
        return None
    info = store.get(resume_step)
    if info is None:
        return None
    t0 = time.monotonic()
    path = restore_watched(info, spec.workdir_path)
    if path is None:
        return None  # a checkpoint of the client API: the script restores it itself
    dated = info.meta.get("dated")
    estimate = dated.get("estimate") if isinstance(dated, dict) else None
    fields: dict[str, Any] = {
        "step": info.step, "path": str(info.path), "source": "watched",
        "seconds": round(time.monotonic() - t0, 6), "restored_to": str(path),
    }  # fmt: skip
    if estimate:
        fields["step_estimate"] = str(estimate)  # the verdict's "resumed" says so
    record.event("restored", sync=True, attempt=attempt, **fields)
    return str(path)


@dataclass
class _Seen:
    """What the watcher knows of one match."""

    sig: tuple[Any, ...]
    since: float  # time.monotonic() when sig was first seen
    done: tuple[Any, ...] | None  # the sig captured (or present at the start): not again
    changes: int = 0  # rewrites seen since the last capture
    first_change: float | None = None  # time.monotonic() of the first of them
    warned: bool = False  # checkpoint_not_settling said for this path
    test: tuple[tuple[Any, ...], str | None] | None = None  # (sig, whole()'s answer) cached

    def sig_mtime(self) -> float:
        """Newest mtime in the signature, unix seconds."""
        return max(int(entry[2]) for entry in self.sig) / 1e9


class CheckpointWatcher:
    """Captures one attempt's watched checkpoints into the run's store (a thread).

    >>> w = CheckpointWatcher(spec, root, attempt=2, pid=child.pid, events=lambda: watch.events,
    ...                       on_event=sink)
    >>> w.start()            # after put_back, so the restored file is not captured again
    >>> w.stop(final=True)   # after the child exited: the final pass
    """

    def __init__(
        self,
        spec: Any,
        root: Path,
        *,
        attempt: int,
        pid: int,
        events: Callable[[], Any],  # a list of events, or (count, recent steps)
        on_event: EventSink,
        resume_step: int | None = None,
        meta: Mapping[str, Any] | None = None,
        mirror: Any = None,
        exclude: Sequence[Path] = (),
        axis: StepAxis | None = None,
    ) -> None:
        self.spec = spec
        ck = spec.checkpoint
        best = tuple(ck.keep_best.rsplit(":", 1)) if ck.keep_best else None
        self.store = CheckpointStore(
            root,
            keep_last=ck.keep_last,
            keep_every=ck.keep_every,
            keep_best=best,
            on_event=self._store_event,
        )
        self.attempt = attempt
        self.pid = pid
        self.on_event = on_event
        self.dating = CaptureDating(
            self.store, events=events, on_event=on_event, axis=axis, resume_step=resume_step,
            tensorboard=spec.progress.tensorboard is not None,
        )  # fmt: skip
        self.meta = dict(meta or {})
        self.mirror = mirror
        self.workdir = spec.workdir_path
        self.settle = float(spec.checkpoint.settle)
        # seconds between polls: a fraction of settle, never a busy loop
        self.interval = max(0.05, min(0.5, self.settle / 4))
        self.exclude = [os.path.realpath(p) for p in exclude]
        self.captured: list[int] = []  # steps committed by this watcher
        self._seen: dict[str, _Seen] = {}
        self._dir_names: set[str] | None = None  # the files of the last directory captured
        self._noted = False  # note_existing() has run
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._errors: set[str] = set()
        self._t0: float | None = None  # time.monotonic() when the capture in progress began

    # ---- lifecycle -----------------------------------------------------------------------

    def note_existing(self) -> None:
        """Mark what is there already as not new: call it before the workload starts.

        A script that writes its checkpoint within milliseconds of starting would
        otherwise have it taken for a leftover of an earlier attempt and never captured.
        """
        now = time.monotonic()
        for path in self._matches():
            sig = self._signature(path)
            if sig is not None:
                self._seen[path] = _Seen(sig, now, sig)
        self._noted = True

    def start(self) -> None:
        """Note what is there already (not captured) unless done, then poll on a thread."""
        if not self._noted:
            self.note_existing()
        if self.mirror is not None:
            self.mirror.start()
        self._thread = threading.Thread(
            target=self._loop, name=f"acceptrun-ckpt-watch-{self.attempt}", daemon=True
        )
        self._thread.start()

    def stop(self, *, final: bool, why_not: str = "") -> None:
        """Stop polling (waiting for a copy in progress), then the final pass.

        ``final``: the workload exited by itself, so a file changed since the last
        capture is complete and is captured now. Otherwise changed files are reported
        (a ``checkpoint_not_captured`` event with ``why_not``), never captured.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self._scan(final=final, why_not=why_not)
            self._redate(final=True)  # with what the final read of the progress proved
        except Exception as exc:  # the final pass must not fail the attempt's bookkeeping
            self._error(exc)
        if self.mirror is not None:
            if not self.mirror.wait(60.0):
                status = {str(k): v for k, v in self.mirror.status().items()}
                self.on_event("mirror_behind", {"status": status})
            self.mirror.close(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._scan(final=None)
            except Exception as exc:  # background work records its failure, never kills the run
                self._error(exc)

    def _error(self, exc: BaseException) -> None:
        text = f"{type(exc).__name__}: {exc}"
        if text not in self._errors:  # one event per distinct failure, not one per poll
            self._errors.add(text)
            self.on_event("checkpoint_watch_error", {"error": text})

    # ---- one pass ------------------------------------------------------------------------

    def _scan(self, *, final: bool | None, why_not: str = "") -> None:
        """One look at every match; ``final`` None while running, else the last pass."""
        now = time.monotonic()
        if self.dating.undated:
            self._redate()
        current = self._matches()
        for gone in set(self._seen) - set(current):
            del self._seen[gone]  # rotated away by the script (save_total_limit)
        ready: list[str] = []
        for path in current:
            sig = self._signature(path)
            if sig is None:
                continue
            seen = self._seen.get(path)
            if seen is None or seen.sig != sig:
                old = seen
                self._seen[path] = seen = _Seen(sig, now, old.done if old else None)
                if old is not None:
                    seen.changes, seen.first_change = old.changes + 1, old.first_change or now
                    seen.warned, seen.test = old.warned, None
            if seen.done == sig:
                continue
            ready.append(path)
        if not ready:
            return
        writing: set[str] | None = None
        complete: list[tuple[str, str]] = []  # (path, how it is known to be complete)
        for path in ready:
            seen = self._seen[path]
            settled = now - seen.since >= self.settle
            if final is None:
                by = f"held still for settle = {self.settle:g}s" if settled else self._whole(path)
                if by is None:
                    self._maybe_not_settling(path, seen, now)
                    continue
                if writing is None:
                    writing = self._open_for_writing()
                    if writing is None:
                        return  # the workload is gone: the final pass decides
                real = os.path.realpath(path)
                if any(w == real or w.startswith(real + os.sep) for w in writing):
                    continue  # still being written: settled sizes can be a pause in a slow save
                complete.append((path, by + "; no process held it open for writing"))
            elif final:
                complete.append((path, "written before the workload exited by itself"))
            else:
                by = self._whole(path)
                if by is None:
                    self.on_event(
                        "checkpoint_not_captured",
                        {"source_path": path, "source": "watched", "reason": why_not + (
                            "; its format does not prove it whole (a torch.save zip, "
                            "safetensors, .npy or JSON would), so a file the kill may have "
                            "torn is not trusted"
                        )},
                    )  # fmt: skip
                    continue
                complete.append((path, by + "; the attempt's processes had exited"))
        # Oldest first, so steps and LATEST follow the order the script wrote them in.
        for path, by in sorted(complete, key=lambda pb: self._seen[pb[0]].sig_mtime()):
            self._capture(path, by)

    def _whole(self, path: str) -> str | None:
        """How the match's own format proves it whole, or None (checkpoint/formats.py).

        A directory: every file is whole and it holds at least the files of the last
        directory captured (a save killed between two files is not whole); live, a
        directory waits for ``settle``, since a script writes its files one by one.
        """
        seen = self._seen[path]
        if seen.test is not None and seen.test[0] == seen.sig:
            return seen.test[1]
        if os.path.isdir(path):
            by: str | None = None
            if self._stop.is_set() and self._dir_names is not None:
                by, names = whole_dir(path)
                missing = sorted(self._dir_names - set(names))
                if by is not None and missing:
                    by = None
        else:
            by = whole(path)
        seen.test = (seen.sig, by)
        return by

    def _maybe_not_settling(self, path: str, seen: _Seen, now: float) -> None:
        """Say once that a file is rewritten too often for ``settle`` to ever see it still."""
        if seen.warned or seen.changes < 3 or seen.first_change is None:
            return
        span = now - seen.first_change
        if span < 2 * self.settle:
            return
        every = span / seen.changes
        seen.warned = True
        self.on_event(
            "checkpoint_not_settling",
            {
                "source_path": path,
                "rewrites": seen.changes,
                "every_s": round(every, 3),
                "settle_s": self.settle,
                "reason": (
                    f"{path} was rewritten {seen.changes} times in {span:.1f}s (about every "
                    f"{every:.2g}s) and never held still for checkpoint.settle = "
                    f"{self.settle:g}s, so none of its saves was captured; set "
                    f"checkpoint.settle below {every:.2g}s, or have the script save "
                    "atomically (write a temporary name, then rename) in a format that "
                    "proves itself whole (torch.save, safetensors, .npy, JSON)"
                ),
            },
        )

    def _capture(self, path: str, complete_by: str) -> None:
        seen = self._seen[path]
        name, relative = self._name(path)
        step, dated = self.dating.step_for(path, seen.sig_mtime())
        existing = self.store.get(step)
        if existing is not None and _same_content(existing, name, path):
            seen.done = seen.sig
            self.on_event(
                "checkpoint_capture_skipped",
                {"step": step, "source_path": path, "reason": "same content as stored"},
            )
            return
        if self.store.taken(step):  # held by other content, or once was: never used again
            held = "holds" if existing is not None else "held (deleted since)"
            dated = {
                "by": f"numbered after the newest stored checkpoint (step {step} {held} "
                "other content)",
                "estimate": dated.get("estimate") or "the step it holds is stored already",
                "pending": True,
            }
            step = self.store.next_free_step()
        pending = bool(dated.pop("pending", True))  # a later report may prove its step
        meta = {**self.meta, "attempt": self.attempt, "source": "watched", "dated": dated}
        if relative:
            meta["watched_relative"] = {name: relative}
        metrics = self.dating.metrics_at(seen.sig_mtime())
        self._t0 = time.monotonic()
        try:
            # Only the state that settled and was seen closed: a write that began since
            # (between the look and the copy) makes it SourceChanged, never a torn copy.
            expect = {name: {rel: (size, mtime) for rel, size, mtime, _ in seen.sig}}
            info, stats = capture(
                self.store, step, {name: path}, metrics=metrics, meta=meta, expect=expect
            )
        except (SourceChanged, FileNotFoundError) as exc:
            # The script began its next save (or rotated the file away) mid-copy: drop
            # this copy, wait for the file to settle again.
            seen.since = time.monotonic()
            self.on_event(
                "checkpoint_capture_dropped",
                {"step": step, "source_path": path, "reason": str(exc)},
            )
            return
        except AcceptrunError as exc:
            seen.done = seen.sig  # not retried until the file changes again
            self.on_event(
                "checkpoint_failed",
                {"step": step, "source": "watched", "source_path": path, "error": str(exc)},
            )
            return
        except OSError as exc:  # disk full, permissions: said, retried when the file changes
            seen.done = seen.sig
            self.on_event(
                "checkpoint_failed",
                {"step": step, "source": "watched", "source_path": path, "error": str(exc)},
            )
            return
        seen.done = seen.sig
        seen.changes, seen.first_change = 0, None
        if os.path.isdir(path):
            self._dir_names = {rel for rel, *_ in seen.sig}
        self.captured.append(info.step)
        if "estimate" in dated and pending:
            self.dating.hold(info.step, seen.sig_mtime(), path)
        self.on_event(
            "checkpoint_captured",
            {
                "step": info.step,
                "source_path": path,
                "complete_by": complete_by,
                "dated_by": dated["by"],
                **({"step_estimate": dated["estimate"]} if "estimate" in dated else {}),
                "bytes": stats.bytes,
                "files": stats.files,
                "capture_s": round(stats.seconds, 6),
                "mb_per_s": round(stats.mb_per_s, 1),
            },
        )
        if self.mirror is not None:
            self.mirror.enqueue(info.step, info.path)

    def _store_event(self, kind: str, fields: dict[str, Any]) -> None:
        """The store's events, a commit marked as watched: no stall for the workload."""
        if kind == "checkpoint_commit":
            fields = {
                **fields,
                "source": "watched",
                "stall_s": 0.0,
                "bytes": fields.get("total_bytes"),
            }
            if self._t0 is not None:
                fields["capture_s"] = round(time.monotonic() - self._t0, 6)
        self.on_event(kind, fields)

    # ---- what a match is -----------------------------------------------------------------

    def _matches(self) -> list[str]:
        """Absolute paths of the watch globs' matches (hidden names are never matched)."""
        found, out = watched_matches(self.spec.checkpoint.watch, self.workdir, self.exclude)
        for path, real in out:
            # A symlink that leads out: never copied into the store, nor written back out
            # there on a restore. Said once (an event), then skipped.
            self._error(UserError(
                f"checkpoint.watch: {path} resolves to {real}, outside the workdir "
                f"{self.workdir}; not captured (have the script write it inside)"
            ))  # fmt: skip
        return found

    @staticmethod
    def _signature(path: str) -> tuple[Any, ...] | None:
        """(name, size, mtime) of the file, or of every file under the directory."""
        try:
            st = os.stat(path)
            if not os.path.isdir(path):
                return (("", st.st_size, st.st_mtime_ns, st.st_ino),)
            out = []
            for root, dirs, files in os.walk(path):
                dirs.sort()
                for f in sorted(files):
                    p = os.path.join(root, f)
                    if os.path.islink(p):
                        continue
                    s = os.stat(p)
                    if not stat.S_ISREG(s.st_mode):
                        continue  # as capture() does: only regular files are copied
                    out.append((os.path.relpath(p, path), s.st_size, s.st_mtime_ns, s.st_ino))
            return tuple(out) if out else None  # an empty directory is not a checkpoint yet
        except FileNotFoundError:
            return None

    def _name(self, path: str) -> tuple[str, str | None]:
        """The stored name of a match, and its path relative to the workdir (None outside)."""
        rel = os.path.relpath(path, self.workdir)
        if rel.startswith(".." + os.sep) or rel == "..":
            return path.lstrip(os.sep), None
        return Path(rel).as_posix(), Path(rel).as_posix()

    def _open_for_writing(self) -> set[str] | None:
        """Real paths the attempt's processes hold open for writing; None once it is gone.

        A workload that is gone may have been killed mid-save: what it left is for the
        final pass to judge (after a kill only a file whose format proves it whole is
        trusted), never for a live pass that would take "nobody writes it" as "complete".
        """
        out: set[str] = set()
        try:
            root = psutil.Process(self.pid)
            if root.status() == psutil.STATUS_ZOMBIE:
                return None
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return None
        for proc in procs:
            with contextlib.suppress(psutil.Error, OSError):
                for f in proc.open_files():
                    if any(m in f.mode for m in _WRITE_MODES):
                        out.add(os.path.realpath(f.path))
        return out

    # ---- which step ----------------------------------------------------------------------

    def _redate(self, *, final: bool = False) -> None:
        """Date the estimated captures again (supervisor/dating.py); follow their moves."""
        done, failed = self.dating.redate(final=final)
        for exc in failed.values():
            self._error(exc)
        for step, info in done.items():
            self.captured = [info.step if s == step else s for s in self.captured]
            if self.mirror is not None and info.step != step:
                self.mirror.enqueue(info.step, info.path)


def _same_content(info: CheckpointInfo, name: str, path: str) -> bool:
    """True when ``path`` holds exactly what ``info`` stored under ``name`` (hashes)."""
    prefix = f"files/{name}"
    stored = {
        arc[len(prefix) :].lstrip("/"): rec
        for arc, rec in info.files.items()
        if arc == prefix or arc.startswith(prefix + "/")
    }
    if not stored:
        return False
    if os.path.isdir(path):
        here = {
            Path(os.path.relpath(os.path.join(r, f), path)).as_posix(): Path(r) / f
            for r, _, fs in os.walk(path)
            for f in fs
            if not os.path.islink(os.path.join(r, f))
        }
    else:
        here = {"": Path(path)}
    if set(here) != set(stored):
        return False
    for rel, rec in stored.items():
        try:
            if here[rel].stat().st_size != rec["size"]:
                return False
            algorithm, _ = split_hash(str(rec["hash"]))
            if hash_file(here[rel], algorithm)[0] != rec["hash"]:
                return False
        except OSError:
            return False
    return True
