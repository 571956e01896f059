"""Mirror: copies of committed checkpoints off the machine (another disk, S3, any fsspec URL).

:class:`Mirror` is the upload queue and its thread; the remote store it writes (its layout,
the checked copies up and down, :func:`~acceptrun.checkpoint.mirror_remote.fetch` and
:func:`~acceptrun.checkpoint.mirror_remote.remote_steps`) is
:mod:`acceptrun.checkpoint.mirror_remote`.

A root belongs to one run (``checkpoint.mirror/<run id>``): its OWNER.json is written with
the first upload, and a Mirror given an ``owner`` neither uploads into nor deletes from a
root another run owns (the step fails, naming that run).

Upload protocol for one step: stream every data file, hashing the bytes *as read from the
local file* and comparing them with the local manifest (a local corruption is refused, never
mirrored); verify the remote copy (``verify="hash"`` re-reads it, ``"size"`` only stats it);
then write MANIFEST.json (byte-identical to the local one) and check it; then advance LATEST.
Verifying before the commit marker means a bad remote copy is never visible as committed.

A background thread does the uploads, so :meth:`Mirror.enqueue` never blocks training. An
outage (connection refused, timeout, bad credentials) leaves the step ``pending`` with the
reason and retries with exponential backoff (``retry_base_s`` doubling to ``retry_max_s``);
the backoff is the mirror's, not the step's, because an outage is a property of the remote.
The queue is served **newest step first**: after an outage the newest checkpoint, the one a
restore needs, is off the machine first; the older ones catch up after it. Per-step states
(``pending``, ``ok``, ``failed``, ``skipped``) live in a local JSON file, so a later attempt
of the run, building a Mirror on the same ``state_path``, resumes the pending ones.

Retention applies remotely too: a step the local store deletes by retention (``keep_last``,
``keep_every``, ``keep_best``) is handed to :meth:`Mirror.retire`, and the mirror thread
deletes its remote copy (MANIFEST.json first, so a half-deleted step is never a
checkpoint), after the uploads. The newest verified step in the mirror (the newest ``ok``)
is never deleted: while a newer one is still pending (an outage) the deletion waits. A
deletion that fails is retried with the uploads' backoff; pending ones are kept in the
state file for the next attempt. Each deletion is a ``mirror_delete`` event with the bytes
it freed, so the ledger counts the mirror's storage from ``mirror_ok`` to ``mirror_delete``.

>>> m = Mirror("s3://bucket/runs/r1/checkpoints", state_path=run_dir / "mirror.json")
>>> m.start(); m.enqueue(100, ckpt_dir / "step-100"); ...; m.wait(timeout=600); m.close()
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import fsspec
from fsspec.implementations.local import LocalFileSystem

from acceptrun._util.durable import (
    fsync_dir,
    read_json,
    write_json_atomic,
)
from acceptrun._util.hashing import hash_bytes
from acceptrun._util.redact import redact_text
from acceptrun.checkpoint.mirror_remote import (
    LATEST,
    MANIFEST,
    LocalProblem,
    check_remote,
    parse_manifest,
    put_bytes,
    put_checked,
    read_latest,
    read_local_manifest,
    remote_owner,
)
from acceptrun.checkpoint.owner import OWNER, StoreOwnedError, StoreOwner
from acceptrun.errors import AcceptrunValueError, RecordError, UserError
from acceptrun.record.workspace import now_iso

__all__ = ["Mirror"]

STATE_KIND = "acceptrun.mirror_state"
_log = logging.getLogger(__name__)

EventSink = Callable[[str, dict[str, Any]], None]


class Mirror:
    """Uploads committed checkpoints of one run to ``url`` in the background.

    ``url`` is the exact root for this run (``s3://bucket/prefix``, ``memory://x``, a path);
    ``storage_options`` go to fsspec (credentials, ``client_kwargs``, retries). ``on_event``
    is called on the mirror thread with ``("mirror_ok", {step, bytes, seconds})``,
    ``("mirror_delete", {step, bytes})`` or ``("mirror_failed", {step, state, reason,
    attempts, ...})``. ``verify="hash"`` re-reads
    every uploaded file; ``"size"`` trusts the remote's size (see
    :func:`~acceptrun.checkpoint.mirror_remote.check_remote`).
    Call :meth:`start` for background uploads; :meth:`upload` is the same work, inline and
    not to be mixed with the thread for one step.
    """

    def __init__(
        self,
        url: str,
        *,
        state_path: Path,
        on_event: EventSink | None = None,
        storage_options: Mapping[str, Any] | None = None,
        retry_base_s: float = 1.0,
        retry_max_s: float = 60.0,
        verify: Literal["hash", "size"] = "hash",
        owner: StoreOwner | None = None,
    ) -> None:
        if retry_base_s <= 0 or retry_max_s < retry_base_s:
            raise AcceptrunValueError(
                f"retry_base_s={retry_base_s}, retry_max_s={retry_max_s}: need "
                "0 < retry_base_s <= retry_max_s (seconds), e.g. 1.0 and 60.0"
            )
        if verify not in ("hash", "size"):
            raise AcceptrunValueError(f"verify={verify!r}: use 'hash' (re-read the copy) or 'size'")
        self.url = url
        self.state_path = Path(state_path)
        self.verify = verify
        self.retry_base_s = retry_base_s
        self.retry_max_s = retry_max_s
        self._on_event = on_event
        self._options = dict(storage_options or {})
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()  # one state-file writer at a time, newest snapshot
        self._queue: dict[int, Path] = {}
        self._active: int | None = None
        self._enqueued: set[int] = set()
        self._failures_in_row = 0
        self._not_before = 0.0  # time.monotonic() before which the remote is not retried
        self._dirty = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self._retiring: set[int] = set()  # steps retention deleted locally: delete remotely
        self.owner = owner  # None: the root is not checked (a caller's own Mirror)
        self._owned = owner is None  # the remote OWNER.json was checked (or written)
        self._states: dict[int, dict[str, Any]] = self._load_states()

    # -- public API ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the upload thread; steps left pending by an earlier attempt are re-queued."""
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop = False
            for step, entry in self._states.items():
                if entry.get("retire"):
                    self._retiring.add(step)
                elif entry["state"] == "pending" and entry.get("path"):
                    self._queue.setdefault(step, Path(entry["path"]))
                    self._enqueued.add(step)
            # daemon: a remote call stuck in an outage must not hold the interpreter at exit;
            # wait() is the way to drain before exiting.
            self._thread = threading.Thread(target=self._loop, name="acceptrun-mirror", daemon=True)
            self._thread.start()

    def enqueue(self, step: int, path: Path) -> None:
        """Queue a committed checkpoint directory for upload; returns at once, never raises."""
        with self._cond:
            self._queue[step] = Path(path)
            self._enqueued.add(step)
            self._set_state(step, "pending", "queued", path=Path(path))
            self._cond.notify_all()

    def retire(self, step: int) -> None:
        """Delete ``step`` from the mirror: retention deleted it locally. Returns at once.

        A step still queued is not uploaded. The deletion runs on the mirror thread after
        the uploads, and never removes the newest verified step of the mirror.
        """
        with self._cond:
            queued = self._queue.pop(step, None) is not None
            self._retiring.add(step)
            if queued or step not in self._states:  # never went up: nothing to wait for
                why = "deleted locally by retention before it was mirrored"
                self._set_state(step, "skipped", why)
            self._states[step]["retire"] = True
            self._dirty = True
            self._cond.notify_all()

    def wait(self, timeout: float | None = None, *, while_healthy: bool = False) -> bool:
        """Block until the queue is drained; True when every enqueued step is ``ok`` or ``skipped``.

        A ``failed`` step makes it False; ``skipped`` (removed locally by retention before
        it went up, superseded by a newer step) and ``deleted`` (removed from the mirror by
        retention) do not. Deletions that may run now are waited for too. Without a running
        thread (before :meth:`start`, after :meth:`close`) it does not wait for the queue.
        ``while_healthy``: give up (False) as soon as the remote's last try failed, instead
        of waiting out its retries: a failing workload's exit, whose next attempt uploads
        what is still pending (and whose wait must not outlast the hang window).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._active is not None or self._deletable():
                if self._thread is None or not self._thread.is_alive():
                    return False
                if while_healthy and self._failures_in_row:
                    return False
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            # "skipped": retention removed the step locally before it went up, because a
            # newer one superseded it; that newer one is what a restore needs.
            done = ("ok", "skipped", "deleted")
            return all(self._states[s]["state"] in done for s in self._enqueued)

    def close(self, timeout: float | None = None) -> None:
        """Stop the thread after the upload in flight; queued steps stay pending on disk."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        self._persist()

    def follow(self, kind: str, fields: Mapping[str, Any]) -> None:
        """A :meth:`CheckpointStore.subscribe` listener: mirror what the store commits.

        A ``checkpoint_commit`` is queued for upload, a ``checkpoint_delete`` by retention
        is retired from the mirror. For saves that commit through the store directly
        (``sharded.save``), not through a Checkpointer, which queues its own commits.
        Returns at once; never raises (the store calls it on the training loop's thread).

        >>> store.subscribe(mirror.follow)
        """
        try:
            retention = str(fields.get("reason") or "").startswith("retention")
            if kind == "checkpoint_commit":
                self.enqueue(int(fields["step"]), Path(str(fields["path"])))
            elif kind == "checkpoint_delete" and retention and not fields.get("error"):
                self.retire(int(fields["step"]))
        except Exception as exc:  # a malformed event must not fail the commit that sent it
            self._emit(
                "mirror_failed",
                {"step": fields.get("step"), "state": "not_queued", "reason": f"{kind}: {exc}"},
            )

    def drain_and_close(self, timeout: float | None = 60.0, *, while_healthy: bool = False) -> bool:
        """Give the queue up to ``timeout`` seconds (``while_healthy``: see :meth:`wait`),
        then stop the thread; True if drained.

        When steps are still pending (an outage, a slow remote), a ``mirror_behind`` event
        carries every step's state, so the lag is on record; the pending steps stay in the
        state file and the next attempt's Mirror uploads them.
        """
        drained = self.wait(timeout, while_healthy=while_healthy)
        if not drained:
            self._emit("mirror_behind", {"status": {str(k): v for k, v in self.status().items()}})
        self.close(timeout=5)
        return drained

    def status(self) -> dict[int, dict[str, Any]]:
        """A copy of the per-step states: ``{step: {state, reason, attempts, ...}}``."""
        with self._cond:
            return {step: dict(entry) for step, entry in sorted(self._states.items())}

    def upload(self, step: int, path: Path) -> None:
        """Upload one step now, on this thread; what the background thread does per step.

        Records the outcome (state file, ``on_event``) and then raises on failure:
        :class:`RecordError` for a damaged local checkpoint, :class:`UserError` for one that
        is gone, the remote's own error (``OSError``, botocore's) for an outage.
        """
        error = self._upload_once(step, Path(path))
        if error is not None:
            raise error

    # -- the worker ------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (
                    self._stop
                    or self._dirty
                    or ((self._queue or self._deletable()) and self._due_in() <= 0)
                ):
                    work = self._queue or self._deletable()
                    self._cond.wait(self._due_in() if work else None)
                if self._stop:
                    return
                job = None
                delete = None
                if not self._dirty and self._queue:
                    job = max(self._queue.items())  # newest step first
                    self._active = job[0]
                    del self._queue[job[0]]
                elif not self._dirty:
                    delete = min(self._deletable())  # uploads first, then the oldest deletion
                    self._active = delete
            if job is None and delete is None:
                self._persist()  # off the lock: enqueue() must not wait for an fsync
                continue
            if job is not None:
                self._upload_once(*job)
            else:
                assert delete is not None
                self._delete_once(delete)
            with self._cond:
                self._active = None
                pending = job is not None and self._states[job[0]]["state"] == "pending"
                if job is not None and pending and job[0] not in self._retiring:
                    self._queue.setdefault(*job)
                self._cond.notify_all()

    def _deletable(self) -> list[int]:
        """Retired steps that may be deleted now; the caller holds ``self._cond``.

        Never the newest verified (``ok``) step of the mirror, retired or not: until a
        newer one is mirrored, it is the copy a restore on another machine needs.
        """
        newest = max((s for s, e in self._states.items() if e["state"] == "ok"), default=None)
        return sorted(s for s in self._retiring if s not in (newest, self._active))

    def _delete_once(self, step: int) -> None:
        """Delete one retired step from the remote; the outcome recorded like an upload's."""
        with self._cond:
            entry = dict(self._states.get(step, {}))
        freed = int(entry.get("bytes") or 0) if entry.get("state") == "ok" else 0
        try:
            fs, root = fsspec.url_to_fs(self.url, **self._options)
            try:
                self._claim_root(fs, root)
            except LocalProblem as exc:  # another run's root: never delete its steps
                with self._cond:
                    self._retiring.discard(step)
                    self._set_state(step, "skipped", f"not deleted from the mirror: {exc}")
                    self._states[step].pop("retire", None)
                self._emit("mirror_failed", {"step": step, "state": "skipped", "reason": str(exc)})
                return
            rdir = f"{root}/step-{step}"
            fs.invalidate_cache(rdir)
            if fs.exists(f"{rdir}/{MANIFEST}"):
                fs.rm_file(f"{rdir}/{MANIFEST}")  # un-commit first: never half a checkpoint
            if fs.exists(rdir):
                fs.rm(rdir, recursive=True)
            if isinstance(fs, LocalFileSystem) and fs.exists(root):
                fsync_dir(root)
        except Exception as exc:  # an outage: retried with the uploads' backoff
            reason = f"{type(exc).__name__}: {exc}"[:500]
            with self._cond:
                self._failures_in_row += 1
                backoff = self.retry_base_s * 2 ** (self._failures_in_row - 1)
                retry_in = min(backoff, self.retry_max_s)
                self._not_before = time.monotonic() + retry_in
                self._states.setdefault(step, {"state": "skipped"})["reason"] = (
                    f"deleting from the mirror failed, retrying: {reason}"
                )
                self._dirty = True
            self._emit(
                "mirror_failed",
                {"step": step, "state": "delete_pending", "reason": reason, "retry_in_s": retry_in},
            )
            return
        with self._cond:
            self._failures_in_row, self._not_before = 0, 0.0
            self._retiring.discard(step)
            self._set_state(step, "deleted", "deleted locally by retention, then from the mirror")
            self._states[step].pop("retire", None)
        self._persist()
        self._emit("mirror_delete", {"step": step, "bytes": freed})

    def _due_in(self) -> float:
        return self._not_before - time.monotonic()

    def _upload_once(self, step: int, path: Path) -> Exception | None:
        """One attempt, its outcome recorded (state file, on_event); returns the error."""
        started = time.monotonic()
        with self._cond:
            attempts = int(self._states.get(step, {}).get("attempts", 0)) + 1
        fields: dict[str, Any] = {"attempts": attempts}
        error: Exception | None = None
        try:
            fields["bytes"] = self._transfer(step, path)
            state, reason = "ok", ""
            fields["seconds"] = round(time.monotonic() - started, 3)
        except LocalProblem as exc:
            state, reason = exc.state, str(exc)
            error = (RecordError if exc.state == "failed" else UserError)(reason)
        except Exception as exc:  # any remote error counts as an outage: retried with backoff
            state, reason, error = "pending", f"{type(exc).__name__}: {exc}"[:500], exc
        event: dict[str, Any] = {"step": step, "state": state, "reason": reason, **fields}
        with self._cond:
            if state == "pending":
                self._failures_in_row += 1
                backoff = self.retry_base_s * 2 ** (self._failures_in_row - 1)
                event["retry_in_s"] = min(backoff, self.retry_max_s)
                self._not_before = time.monotonic() + event["retry_in_s"]
                for other in self._queue:  # the queued ones wait on the same outage
                    self._states[other]["reason"] = f"waiting for the remote: {reason}"
            elif state == "ok":
                self._failures_in_row, self._not_before = 0, 0.0
            self._set_state(step, state, reason, path=path, **fields)
        self._persist()
        if state == "ok":
            self._emit(
                "mirror_ok", {"step": step, "bytes": event["bytes"], "seconds": event["seconds"]}
            )
        else:
            self._emit("mirror_failed", event)
        return error

    def _transfer(self, step: int, path: Path) -> int:
        """Copy one committed step to the remote; returns the bytes uploaded."""
        raw = read_local_manifest(step, path)
        files = parse_manifest(raw, step=step, where=str(path / MANIFEST), error=LocalProblem)
        fs, root = fsspec.url_to_fs(self.url, **self._options)  # cached per thread by fsspec
        local = isinstance(fs, LocalFileSystem)
        self._claim_root(fs, root)
        rdir = f"{root}/step-{step}"
        fs.invalidate_cache(rdir)
        if fs.exists(f"{rdir}/{MANIFEST}"):
            # A copy of this step from an earlier attempt: un-commit it before its files change.
            fs.rm_file(f"{rdir}/{MANIFEST}")
        total = 0
        for rel, entry in files.items():
            total += put_checked(fs, path, step, rel, entry, f"{rdir}/{rel}", local=local)
        if local:  # the new directory entries, so a power cut cannot lose the files
            for directory in {f"{rdir}/{d}" for rel in files for d in PurePosixPath(rel).parents}:
                fsync_dir(directory)
            fsync_dir(root)
        check_remote(fs, rdir, files, self.verify)
        put_bytes(fs, f"{rdir}/{MANIFEST}", raw, local=local)
        try:
            manifest = {MANIFEST: {"size": len(raw), "hash": hash_bytes(raw)}}
            check_remote(fs, rdir, manifest, self.verify)
        except Exception:
            fs.rm_file(f"{rdir}/{MANIFEST}")  # never leave a commit marker over a bad copy
            raise
        current = read_latest(fs, root)
        if current is None or current <= step:  # newest-first catch-up must not move it back
            put_bytes(fs, f"{root}/{LATEST}", f"step-{step}\n".encode(), local=local)
        return total + len(raw)

    def _claim_root(self, fs: Any, root: str) -> None:
        """Check the root's OWNER.json once (write it when absent); another run's raises
        LocalProblem: retrying will not help, and nothing of that run is touched."""
        if self._owned or self.owner is None:
            return
        try:
            found = remote_owner(fs, root, self.url)
        except StoreOwnedError as exc:
            raise LocalProblem(str(exc)) from exc
        if found is None:
            local = isinstance(fs, LocalFileSystem)
            if local:
                fs.makedirs(root, exist_ok=True)
            doc = json.dumps(self.owner.to_doc(), indent=2, sort_keys=True) + "\n"
            put_bytes(fs, f"{root}/{OWNER}", doc.encode(), local=local)
        elif not found.same_run(self.owner):
            raise LocalProblem(
                f"the mirror root {self.url} belongs to {found.describe()}, not to "
                f"{self.owner.describe()}; set checkpoint.mirror elsewhere (each run mirrors "
                "to checkpoint.mirror/<run id>)"
            )
        self._owned = True

    # -- state -----------------------------------------------------------------------------

    def _set_state(self, step: int, state: str, reason: str, **fields: Any) -> None:
        """Update one step's entry; the caller holds ``self._cond``."""
        entry = self._states.setdefault(step, {"attempts": 0, "bytes": 0, "seconds": 0.0})
        if "path" in fields:
            fields["path"] = str(fields["path"])
        entry.update(state=state, reason=reason, updated_at=now_iso(), **fields)
        self._dirty = True
        self._cond.notify_all()

    def _load_states(self) -> dict[int, dict[str, Any]]:
        """Steps recorded by an earlier Mirror of this run (same state file, same url)."""
        try:
            doc = read_json(self.state_path)
            # The file holds the url redacted (it is a record file): compare it so.
            if doc["kind"] == STATE_KIND and doc["url"] == redact_text(self.url):
                return {int(k): {"state": v["state"], **v} for k, v in doc["steps"].items()}
        except (RecordError, OSError, LookupError, TypeError, ValueError):
            pass  # missing or damaged: a progress cache, not the truth (remote manifests are)
        return {}

    def _persist(self) -> None:
        """Write the state file off the caller's lock; the last writer writes the newest."""
        with self._write_lock:
            with self._cond:
                self._dirty = False
                steps = {str(s): dict(e) for s, e in sorted(self._states.items())}
            doc = {"kind": STATE_KIND, "schema": 1, "url": self.url, "steps": steps}
            try:
                self.state_path.parent.mkdir(parents=True, exist_ok=True)
                write_json_atomic(self.state_path, doc)
            except Exception as exc:  # a full disk must not stop the mirror itself
                self._emit(
                    "mirror_failed", {"step": None, "state": "state_file", "reason": str(exc)}
                )

    def _emit(self, name: str, payload: dict[str, Any]) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(name, payload)
        except Exception:  # a broken callback must not stop the uploads
            _log.exception("mirror on_event callback failed for %s", name)


# -- fetch and listing ---------------------------------------------------------------------
