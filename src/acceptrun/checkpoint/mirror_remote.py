"""The mirror's remote store: its layout, the checked copies up and down, and fetch.

A mirror root holds one run's checkpoints in the store's own layout::

    <url>/step-<N>/<files...>       data files, uploaded first
    <url>/step-<N>/MANIFEST.json    the commit marker: a remote step without it is not a checkpoint
    <url>/LATEST                    "step-<N>\\n", the newest step mirrored whole; never moves back
    <url>/OWNER.json                the run the root belongs to (checkpoint/owner.py)

Every byte is checked against the manifest as it moves: :func:`put_checked` hashes a local
file as it is read and uploaded, :func:`check_remote` verifies the remote copy before its
commit marker is written, and :func:`fetch` checks each downloaded file before the step is
renamed into place. :func:`fetch` without a step falls back from a step that does not
verify to the next older one, reporting each one it passed over to ``on_reject``
(``acceptrun resume --from-mirror`` records them as ``mirror_quarantine`` events); with
``step`` it fetches that one or raises naming the steps there.
:class:`acceptrun.checkpoint.mirror.Mirror` is the upload queue and its thread that uses
them.

>>> remote_steps("s3://bucket/runs/r1/checkpoints")
>>> fetch("s3://bucket/runs/r1/checkpoints", Path("restore"))  # newest step, verified
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import fsspec

from acceptrun._util.durable import (
    fsync_dir,
    loads_json,
    write_atomic,
)
from acceptrun._util.hashing import CHUNK, new_hasher
from acceptrun.checkpoint.owner import OWNER, StoreOwnedError, StoreOwner, parse_owner
from acceptrun.errors import RecordError, UserError

__all__ = [
    "LATEST",
    "MANIFEST",
    "LocalProblem",
    "check_remote",
    "fetch",
    "parse_manifest",
    "put_bytes",
    "put_checked",
    "read_latest",
    "read_local_manifest",
    "remote_owner",
    "remote_steps",
]

MANIFEST = "MANIFEST.json"
LATEST = "LATEST"
_STEP_DIR = re.compile(r"step-(0|[1-9][0-9]*)")  # as the store names them: no leading zeros


class LocalProblem(Exception):
    """The local checkpoint cannot be mirrored: retrying will not help."""

    def __init__(self, reason: str, state: Literal["failed", "skipped"] = "failed") -> None:
        super().__init__(reason)
        self.state = state


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
    latest = read_latest(fs, root)
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
    files = parse_manifest(raw, step=step, where=f"{url}/step-{step}/{MANIFEST}", error=RecordError)
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


def read_local_manifest(step: int, path: Path) -> bytes:
    try:
        return (path / MANIFEST).read_bytes()
    except FileNotFoundError:
        if not path.exists():
            gone = f"{path} was deleted locally before it was mirrored (retention or quarantine)"
            raise LocalProblem(gone, "skipped") from None
        raise LocalProblem(f"{path} has no {MANIFEST}: not a committed checkpoint") from None
    except OSError as exc:
        raise LocalProblem(f"cannot read {path / MANIFEST}: {exc}") from exc


def parse_manifest(
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


def check_remote(fs: Any, rdir: str, files: Mapping[str, Mapping[str, Any]], verify: str) -> None:
    """Each remote file has its manifest size; with ``verify="hash"`` its bytes too."""
    for rel, entry in files.items():
        rpath = f"{rdir}/{rel}"
        fs.invalidate_cache(rpath)  # s3fs caches listings; ask the server
        size = int(fs.info(rpath)["size"])
        if size != entry["size"]:
            raise OSError(f"remote {rpath} has {size} bytes, expected {entry['size']}")
        if verify == "hash":
            # Costs a full download of the checkpoint (GET requests, egress outside the
            # region), on the mirror thread only: it proves the bytes that landed.
            digest, _ = _copy(_remote_chunks(fs, rpath), None, _algorithm(entry))
            if digest != entry["hash"]:
                raise OSError(f"remote {rpath} reads back as {digest}, not {entry['hash']}")


def put_checked(
    fs: Any, path: Path, step: int, rel: str, entry: Mapping[str, Any], rpath: str, *, local: bool
) -> int:
    """Upload one local file, refusing it when its bytes do not match the manifest."""
    where = f"step-{step}/{rel}"
    try:
        src = open(path / rel, "rb")  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:
        if not path.exists():
            raise LocalProblem(f"{path} was deleted locally while mirroring", "skipped") from None
        raise LocalProblem(f"{where} is in the manifest but missing locally") from None
    except OSError as exc:
        raise LocalProblem(f"cannot open local file {where}: {exc}") from exc
    with src:
        if local:
            # Only on a local disk: s3fs's makedirs would create a missing (mistyped) bucket.
            fs.makedirs(str(PurePosixPath(rpath).parent), exist_ok=True)
        try:
            with fs.open(rpath, "wb") as out:  # s3: one PUT, or multipart past the block size
                digest, size = _copy(_local_chunks(src, where), out, _algorithm(entry))
            if digest != entry["hash"] or size != entry["size"]:
                raise LocalProblem(
                    f"local file {where} does not match its manifest: {digest} ({size} bytes), "
                    f"manifest says {entry['hash']} ({entry['size']} bytes); the local copy "
                    "is corrupt and was not mirrored"
                )
        except LocalProblem:
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
            raise LocalProblem(f"cannot read local file {where}: {exc}") from exc
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


def put_bytes(fs: Any, rpath: str, data: bytes, *, local: bool) -> None:
    """Write a small object whole: atomic rename on a local disk, one PUT on object stores."""
    if local:
        write_atomic(rpath, data)
    else:
        fs.pipe_file(rpath, data)


def read_latest(fs: Any, root: str) -> int | None:
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
