"""Mirror: copies of committed checkpoints off the machine (another disk, S3, any fsspec URL).

A mirror root holds one run's checkpoints in the store's own layout::

    <url>/step-<N>/<files...>       data files, uploaded first
    <url>/step-<N>/MANIFEST.json    the commit marker: a remote step without it is not a checkpoint
    <url>/LATEST                    "step-<N>\\n", the newest step mirrored whole; never moves back
    <url>/OWNER.json                the run the root belongs to (checkpoint/owner.py)

A root belongs to one run (``checkpoint.mirror/<run id>``): its OWNER.json is written with
the first upload, and a Mirror given an ``owner`` neither uploads into nor deletes from a
root another run owns (the step fails, naming that run). :func:`fetch` without a step
falls back from a step that does not verify to the next older one, reporting each one it
passed over to ``on_reject`` (``acceptrun resume --from-mirror`` records them as
``mirror_quarantine`` events); with ``step`` it fetches that one or raises naming the
steps there.

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
>>> fetch("s3://bucket/runs/r1/checkpoints", Path("restore"))  # newest step, verified
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import fsspec
from fsspec.implementations.local import LocalFileSystem

from acceptrun._util.durable import (
    fsync_dir,
    loads_json,
    read_json,
    write_atomic,
    write_json_atomic,
)
from acceptrun._util.hashing import CHUNK, hash_bytes, new_hasher
from acceptrun._util.redact import redact_text
from acceptrun.checkpoint.owner import OWNER, StoreOwnedError, StoreOwner, parse_owner
from acceptrun.errors import AcceptrunValueError, RecordError, UserError
from acceptrun.record.workspace import now_iso

__all__ = ["Mirror", "fetch", "remote_owner", "remote_steps"]

MANIFEST = "MANIFEST.json"
LATEST = "LATEST"
STATE_KIND = "acceptrun.mirror_state"
_STEP_DIR = re.compile(r"step-(0|[1-9][0-9]*)")  # as the store names them: no leading zeros
_log = logging.getLogger(__name__)

EventSink = Callable[[str, dict[str, Any]], None]


class _LocalProblem(Exception):
    """The local checkpoint cannot be mirrored: retrying will not help."""

    def __init__(self, reason: str, state: Literal["failed", "skipped"] = "failed") -> None:
        super().__init__(reason)
        self.state = state


class Mirror:
    """Uploads committed checkpoints of one run to ``url`` in the background.

    ``url`` is the exact root for this run (``s3://bucket/prefix``, ``memory://x``, a path);
    ``storage_options`` go to fsspec (credentials, ``client_kwargs``, retries). ``on_event``
    is called on the mirror thread with ``("mirror_ok", {step, bytes, seconds})``,
    ``("mirror_delete", {step, bytes})`` or ``("mirror_failed", {step, state, reason,
    attempts, ...})``. ``verify="hash"`` re-reads
    every uploaded file; ``"size"`` trusts the remote's size (see :meth:`_check_remote`).
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

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the queue is drained; True when every enqueued step is ``ok`` or ``skipped``.

        A ``failed`` step makes it False; ``skipped`` (removed locally by retention before
        it went up, superseded by a newer step) and ``deleted`` (removed from the mirror by
        retention) do not. Deletions that may run now are waited for too. Without a running
        thread (before :meth:`start`, after :meth:`close`) it does not wait for the queue.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._active is not None or self._deletable():
                if self._thread is None or not self._thread.is_alive():
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

    def drain_and_close(self, timeout: float | None = 60.0) -> bool:
        """Give the queue up to ``timeout`` seconds, then stop the thread; True if drained.

        When steps are still pending (an outage, a slow remote), a ``mirror_behind`` event
        carries every step's state, so the lag is on record; the pending steps stay in the
        state file and the next attempt's Mirror uploads them.
        """
        drained = self.wait(timeout)
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
            except _LocalProblem as exc:  # another run's root: never delete its steps
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
        except _LocalProblem as exc:
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
        raw = _read_local_manifest(step, path)
        files = _parse_manifest(raw, step=step, where=str(path / MANIFEST), error=_LocalProblem)
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
            total += _put_checked(fs, path, step, rel, entry, f"{rdir}/{rel}", local=local)
        if local:  # the new directory entries, so a power cut cannot lose the files
            for directory in {f"{rdir}/{d}" for rel in files for d in PurePosixPath(rel).parents}:
                fsync_dir(directory)
            fsync_dir(root)
        self._check_remote(fs, rdir, files)
        _put_bytes(fs, f"{rdir}/{MANIFEST}", raw, local=local)
        try:
            self._check_remote(fs, rdir, {MANIFEST: {"size": len(raw), "hash": hash_bytes(raw)}})
        except Exception:
            fs.rm_file(f"{rdir}/{MANIFEST}")  # never leave a commit marker over a bad copy
            raise
        current = _read_latest(fs, root)
        if current is None or current <= step:  # newest-first catch-up must not move it back
            _put_bytes(fs, f"{root}/{LATEST}", f"step-{step}\n".encode(), local=local)
        return total + len(raw)

    def _claim_root(self, fs: Any, root: str) -> None:
        """Check the root's OWNER.json once (write it when absent); another run's raises
        _LocalProblem: retrying will not help, and nothing of that run is touched."""
        if self._owned or self.owner is None:
            return
        try:
            found = remote_owner(fs, root, self.url)
        except StoreOwnedError as exc:
            raise _LocalProblem(str(exc)) from exc
        if found is None:
            local = isinstance(fs, LocalFileSystem)
            if local:
                fs.makedirs(root, exist_ok=True)
            doc = json.dumps(self.owner.to_doc(), indent=2, sort_keys=True) + "\n"
            _put_bytes(fs, f"{root}/{OWNER}", doc.encode(), local=local)
        elif not found.same_run(self.owner):
            raise _LocalProblem(
                f"the mirror root {self.url} belongs to {found.describe()}, not to "
                f"{self.owner.describe()}; set checkpoint.mirror elsewhere (each run mirrors "
                "to checkpoint.mirror/<run id>)"
            )
        self._owned = True

    def _check_remote(self, fs: Any, rdir: str, files: Mapping[str, Mapping[str, Any]]) -> None:
        for rel, entry in files.items():
            rpath = f"{rdir}/{rel}"
            fs.invalidate_cache(rpath)  # s3fs caches listings; ask the server
            size = int(fs.info(rpath)["size"])
            if size != entry["size"]:
                raise OSError(f"remote {rpath} has {size} bytes, expected {entry['size']}")
            if self.verify == "hash":
                # Costs a full download of the checkpoint (GET requests, egress outside the
                # region), on the mirror thread only: it proves the bytes that landed.
                digest, _ = _copy(_remote_chunks(fs, rpath), None, _algorithm(entry))
                if digest != entry["hash"]:
                    raise OSError(f"remote {rpath} reads back as {digest}, not {entry['hash']}")

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


def remote_steps(url: str, *, storage_options: Mapping[str, Any] | None = None) -> list[int]:
    """Steps committed in the mirror at ``url`` (those with a MANIFEST.json), ascending."""
    fs, root = fsspec.url_to_fs(url, **dict(storage_options or {}))
    return _committed_steps(fs, root)


def fetch(
    url: str,
    dest_root: Path,
    *,
    step: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    owner: StoreOwner | None = None,
    on_reject: Callable[[int, str], None] | None = None,
) -> Path:
    """Download a mirrored step into ``dest_root/step-<N>/``, verified; returns that directory.

    Without ``step``: the remote LATEST, else the highest committed step; a step whose
    manifest or files do not verify is passed over for the next older one (each reported
    to ``on_reject(step, reason)``), and :class:`RecordError` is raised when none does.
    With ``step``: that one, or :class:`UserError` naming the committed steps when it is
    not there or does not verify. Files go to a staging directory, each checked against
    the manifest's size and hash, then fsynced and renamed into place; ``dest_root/LATEST``
    then names the step. A failed step leaves ``dest_root`` as it was. ``owner``: refuse
    a root whose OWNER.json names another run.

    >>> fetch("s3://bucket/runs/r1/checkpoints", Path("ckpt"), step=200)
    """
    fs, root = fsspec.url_to_fs(url, **dict(storage_options or {}))
    found = None if owner is None else remote_owner(fs, root, url)
    if found is not None and owner is not None and not found.same_run(owner):
        raise StoreOwnedError(
            f"the mirror root {url} belongs to {found.describe()}, not to "
            f"{owner.describe()}: nothing was fetched. Resume that run, or name this "
            "run's own root (checkpoint.mirror/<run id>) with --mirror"
        )
    steps = _committed_steps(fs, root)
    if step is not None:
        if step not in steps:
            raise UserError(
                f"step {step} is not in the mirror at {url} (no step-{step}/{MANIFEST}); "
                f"committed steps there: {steps or 'none'}. Nothing was "
                "fetched; pick one of them with --step"
            )
        try:
            return _fetch_step(fs, root, url, Path(dest_root), step)
        except RecordError as exc:
            if on_reject is not None:
                on_reject(step, str(exc))
            others = [s for s in steps if s != step]
            raise UserError(
                f"step {step} in the mirror at {url} does not verify: {exc} Nothing was "
                f"restored; the other committed steps there: {others or 'none'} (pick one "
                "with --step, or leave "
                "--step out for the newest that verifies)"
            ) from exc
    if not steps:
        raise UserError(f"no checkpoint in the mirror at {url}: no step-<N>/{MANIFEST} there")
    latest = _read_latest(fs, root)
    order = sorted(steps, reverse=True)
    if latest is not None and latest in steps:  # LATEST first, then the older ones
        order = [latest] + [s for s in order if s < latest]
    rejected = []
    for candidate in order:
        try:
            return _fetch_step(fs, root, url, Path(dest_root), candidate)
        except RecordError as exc:
            rejected.append(f"step {candidate}: {exc}")
            if on_reject is not None:
                on_reject(candidate, str(exc))
    raise RecordError(
        f"no step in the mirror at {url} verifies ({'; '.join(rejected)}). Nothing was "
        "restored; mirror the run again from a machine that has its checkpoints"
    )


def remote_owner(fs: Any, root: str, url: str) -> StoreOwner | None:
    """The owner in ``root/OWNER.json`` of a mirror; None when the root has none (older)."""
    try:
        fs.invalidate_cache(root)
        raw = fs.cat_file(f"{root}/{OWNER}")
    except FileNotFoundError:
        return None
    try:
        doc = loads_json(raw)
    except ValueError:
        doc = None
    return parse_owner(doc, f"{url}/{OWNER}")


def _fetch_step(fs: Any, root: str, url: str, dest_root: Path, step: int) -> Path:
    """Fetch one committed step, verified (:class:`RecordError` when it is not)."""
    rdir = f"{root}/step-{step}"
    try:
        raw = fs.cat_file(f"{rdir}/{MANIFEST}")
    except FileNotFoundError:
        raise RecordError(f"{url}/step-{step}/{MANIFEST} is gone from the mirror") from None
    files = _parse_manifest(
        raw, step=step, where=f"{url}/step-{step}/{MANIFEST}", error=RecordError
    )
    created = not dest_root.exists()
    dest_root.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(4)
    staging = dest_root / f".fetch-step-{step}-{token}"
    final = dest_root / f"step-{step}"
    try:
        staging.mkdir()
        for rel, entry in files.items():
            shown = f"{url}/step-{step}/{rel}"
            try:
                _get_checked(fs, f"{rdir}/{rel}", staging / rel, entry, shown)
            except FileNotFoundError:
                raise RecordError(f"mirror copy {shown} is missing (in its manifest)") from None
        write_atomic(staging / MANIFEST, raw)  # last, as in the store: the commit marker
        for directory in {staging / d for rel in files for d in PurePosixPath(rel).parents}:
            fsync_dir(directory)
        if final.exists():  # replace an older local copy whole: aside, swap, then delete
            aside = dest_root / f".replaced-step-{step}-{token}"
            os.replace(final, aside)
            os.replace(staging, final)
            shutil.rmtree(aside)
        else:
            os.replace(staging, final)
        fsync_dir(dest_root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            shutil.rmtree(dest_root, ignore_errors=True)
        raise
    write_atomic(dest_root / LATEST, f"step-{step}\n")
    return final


# -- helpers -------------------------------------------------------------------------------


def _read_local_manifest(step: int, path: Path) -> bytes:
    try:
        return (path / MANIFEST).read_bytes()
    except FileNotFoundError:
        if not path.exists():
            gone = f"{path} was deleted locally before it was mirrored (retention or quarantine)"
            raise _LocalProblem(gone, "skipped") from None
        raise _LocalProblem(f"{path} has no {MANIFEST}: not a committed checkpoint") from None
    except OSError as exc:
        raise _LocalProblem(f"cannot read {path / MANIFEST}: {exc}") from exc


def _parse_manifest(
    raw: bytes, *, step: int, where: str, error: Callable[[str], Exception]
) -> dict[str, dict[str, Any]]:
    """The ``files`` of a checkpoint manifest, validated; problems raise ``error(message)``."""
    try:
        doc = loads_json(raw)
    except ValueError as exc:  # not JSON, not UTF-8, nested too deep, too large
        raise error(f"{where} is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("kind") != "acceptrun.checkpoint":
        raise error(f"{where} is not a checkpoint manifest (kind != 'acceptrun.checkpoint')")
    if doc.get("schema") != 1 or doc.get("step") != step:
        raise error(
            f"{where}: schema {doc.get('schema')!r}, step {doc.get('step')!r}; expected 1, {step}"
        )
    files = doc.get("files")
    if not isinstance(files, dict):
        raise error(f"{where}: 'files' is not a mapping of path -> {{size, hash}}")
    for rel, entry in files.items():
        parts = PurePosixPath(rel).parts
        if not rel or rel.startswith("/") or ".." in parts or rel == MANIFEST:
            # "../x" from a tampered remote manifest would write outside the step directory
            raise error(f"{where}: file path {rel!r} must be relative, inside the step directory")
        if not (isinstance(entry, dict) and type(entry.get("size")) is int and _known(entry)):
            raise error(f"{where}: entry for {rel!r} needs an int size and an 'xxh3_128:' hash")
    return {rel: files[rel] for rel in sorted(files)}


def _known(entry: Mapping[str, Any]) -> bool:
    """Whether ``entry["hash"]`` is ``"<algorithm>:<hex>"`` with an algorithm we can compute."""
    algorithm, sep, digest = str(entry.get("hash", "")).partition(":")
    try:
        new_hasher(algorithm)
    except ValueError:
        return False
    return bool(sep and digest)


def _copy(chunks: Iterable[bytes], dst: Any, algorithm: str) -> tuple[str, int]:
    """Write ``chunks`` to ``dst`` (None: only read them); returns the hash of what was read."""
    hasher, size = new_hasher(algorithm), 0
    for chunk in chunks:
        hasher.update(chunk)
        size += len(chunk)
        if dst is not None:
            dst.write(chunk)
    return f"{algorithm}:{hasher.hexdigest()}", size


def _remote_chunks(fs: Any, rpath: str) -> Iterator[bytes]:
    with fs.open(rpath, "rb") as f:
        yield from iter(lambda: f.read(CHUNK), b"")


def _algorithm(entry: Mapping[str, Any]) -> str:
    return str(entry["hash"]).split(":", 1)[0]


def _put_checked(
    fs: Any, path: Path, step: int, rel: str, entry: Mapping[str, Any], rpath: str, *, local: bool
) -> int:
    """Upload one local file, refusing it when its bytes do not match the manifest."""
    where = f"step-{step}/{rel}"
    try:
        src = open(path / rel, "rb")  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:
        if not path.exists():
            raise _LocalProblem(f"{path} was deleted locally while mirroring", "skipped") from None
        raise _LocalProblem(f"{where} is in the manifest but missing locally") from None
    except OSError as exc:
        raise _LocalProblem(f"cannot open local file {where}: {exc}") from exc
    with src:
        if local:
            # Only on a local disk: s3fs's makedirs would create a missing (mistyped) bucket.
            fs.makedirs(str(PurePosixPath(rpath).parent), exist_ok=True)
        try:
            with fs.open(rpath, "wb") as out:  # s3: one PUT, or multipart past the block size
                digest, size = _copy(_local_chunks(src, where), out, _algorithm(entry))
            if digest != entry["hash"] or size != entry["size"]:
                raise _LocalProblem(
                    f"local file {where} does not match its manifest: {digest} ({size} bytes), "
                    f"manifest says {entry['hash']} ({entry['size']} bytes); the local copy "
                    "is corrupt and was not mirrored"
                )
        except _LocalProblem:
            # Uncommitted anyway (no manifest goes up); still, leave no bad bytes about.
            with contextlib.suppress(Exception):
                fs.rm_file(rpath)
            raise
    if local:
        with open(rpath, "rb") as f:
            os.fsync(f.fileno())
    return size


def _local_chunks(f: Any, where: str) -> Iterator[bytes]:
    """Chunks of a local file; a read error fails the step instead of passing for an outage."""
    while True:
        try:
            chunk: bytes = f.read(CHUNK)
        except OSError as exc:
            raise _LocalProblem(f"cannot read local file {where}: {exc}") from exc
        if not chunk:
            return
        yield chunk


def _get_checked(fs: Any, rpath: str, dst: Path, entry: Mapping[str, Any], shown: str) -> None:
    """Download one remote file to ``dst``, fsynced, raising when it does not match."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fs.invalidate_cache(rpath)  # s3fs would trust a cached listing's size
    with open(dst, "wb") as out:
        digest, size = _copy(_remote_chunks(fs, rpath), out, _algorithm(entry))
        out.flush()
        os.fsync(out.fileno())
    if digest != entry["hash"] or size != entry["size"]:
        raise RecordError(
            f"mirror copy {shown} is corrupt: {digest} ({size} bytes), its manifest says "
            f"{entry['hash']} ({entry['size']} bytes)."
        )


def _put_bytes(fs: Any, rpath: str, data: bytes, *, local: bool) -> None:
    """Write a small object whole: atomic rename on a local disk, one PUT on object stores."""
    if local:
        write_atomic(rpath, data)
    else:
        fs.pipe_file(rpath, data)


def _read_latest(fs: Any, root: str) -> int | None:
    try:
        fs.invalidate_cache(root)
        text = fs.cat_file(f"{root}/{LATEST}").decode().strip()
    except FileNotFoundError:
        return None
    match = _STEP_DIR.fullmatch(text)
    return int(match.group(1)) if match else None


def _committed_steps(fs: Any, root: str) -> list[int]:
    fs.invalidate_cache(root)
    steps = set()
    for found in fs.glob(f"{root}/step-*/{MANIFEST}"):
        match = _STEP_DIR.fullmatch(PurePosixPath(found).parent.name)
        if match:
            steps.add(int(match.group(1)))
    return sorted(steps)
