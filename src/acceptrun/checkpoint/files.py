"""Checkpoints made of a script's own files: capture them into the store, put them back.

A script that writes its own checkpoint (``torch.save(state, "out/ckpt.pt")``, a Hugging
Face ``checkpoint-500/`` directory, a Lightning ``.ckpt``) keeps doing so. acceptrun copies
each completed one into its :class:`~acceptrun.checkpoint.store.CheckpointStore` as an
ordinary checkpoint (hashed while written, fsynced, manifest last, verified, quarantined,
retained, mirrored), and on a restart copies the newest verified one back to where the
script expects it. The manifest's ``meta["files"]`` maps each stored name to the path it
came from, so a restore needs nothing but the checkpoint.

Layout inside ``step-<N>/``: ``files/<name>`` for a single file, ``files/<name>/<rel>`` for
every file under a directory. Nothing here imports torch or unpickles anything: files are
bytes.

>>> info = capture(store, 500, {"ckpt.pt": Path("out/ckpt.pt")})
>>> put_back(info)            # out/ckpt.pt is the committed copy again
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from acceptrun._util.durable import fsync_dir
from acceptrun._util.hashing import new_hasher, split_hash
from acceptrun._util.paths import confine
from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore
from acceptrun.errors import RecordError, UserError

__all__ = ["PREFIX", "CaptureStats", "SourceChanged", "capture", "put_back", "sources_of"]

PREFIX = "files"
_CHUNK = 8 << 20


class SourceChanged(RecordError):
    """A source file changed while it was being copied; the save was abandoned. Retry later."""


@dataclass(frozen=True)
class CaptureStats:
    """What one capture copied: bytes, files and seconds (for the bench and the events)."""

    bytes: int
    files: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else float("inf")


def _walk(src: Path) -> list[tuple[str, Path]]:
    """(relative posix name, path) of every regular file under ``src``, sorted; no symlinks."""
    if src.is_file():
        return [("", src)]
    out = []
    for root, dirs, files in os.walk(src):
        dirs.sort()
        for f in sorted(files):
            p = Path(root) / f
            if p.is_symlink() or not p.is_file():
                continue  # a link may point outside: never follow it into a checkpoint
            out.append((p.relative_to(src).as_posix(), p))
    return out


def capture(
    store: CheckpointStore,
    step: int,
    sources: Mapping[str, str | os.PathLike[str]],
    *,
    metrics: Mapping[str, float] | None = None,
    meta: Mapping[str, Any] | None = None,
    expect: Mapping[str, Mapping[str, tuple[int, int]]] | None = None,
) -> tuple[CheckpointInfo, CaptureStats]:
    """Copy ``sources`` (stored name -> file or directory) into the store as ``step``.

    Each file is copied in chunks, hashed as written and fsynced; its size and mtime are
    compared before and after, and a file that changed meanwhile (the script began its
    next save) abandons the save with :class:`SourceChanged`, leaving the store as it
    was. A missing source is a :class:`UserError` naming it. ``expect`` (stored name ->
    {relative file name ("" for a single file): (size, mtime_ns)}) is the state the
    caller judged complete: any other state before the copy is also SourceChanged.
    """
    t0 = time.monotonic()
    listing: dict[str, dict[str, Any]] = {}
    plan: list[tuple[str, Path, os.stat_result]] = []
    for name, raw in sources.items():
        pure = PurePosixPath(name)
        if not name or pure.is_absolute() or ".." in pure.parts or str(pure) != name:
            raise UserError(f"stored name {name!r} must be a plain relative name")
        src = Path(raw).absolute()
        if not src.exists():
            raise UserError(f"checkpoint source {src} does not exist; nothing was captured")
        kind = "dir" if src.is_dir() else "file"
        listing[name] = {"path": str(src), "type": kind}
        found = {}
        for rel, path in _walk(src):
            arc = f"{PREFIX}/{name}" + (f"/{rel}" if rel else "")
            st = path.stat()
            plan.append((arc, path, st))
            found[rel] = (st.st_size, st.st_mtime_ns)
        if expect is not None and name in expect and dict(expect[name]) != found:
            raise SourceChanged(f"{src} changed since it was judged complete (step {step})")
    writer = store.begin(step)
    total = 0
    try:
        for arc, path, before in plan:
            with path.open("rb") as fin, writer.open(arc) as fout:
                while chunk := fin.read(_CHUNK):
                    fout.write(chunk)
                    total += len(chunk)
            after = path.stat()
            if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
                raise SourceChanged(f"{path} changed while it was copied (step {step})")
    except BaseException:
        store.abort(writer)
        raise
    info = store.commit(
        writer, metrics=metrics, meta={**dict(meta or {}), "files": listing, "external": True}
    )
    return info, CaptureStats(total, len(plan), time.monotonic() - t0)


def sources_of(info: CheckpointInfo) -> dict[str, dict[str, Any]]:
    """Stored name -> {"path", "type"} of a captured checkpoint; empty for a client one."""
    files = info.meta.get("files")
    return dict(files) if isinstance(files, dict) else {}


def put_back(
    info: CheckpointInfo, targets: Mapping[str, str | os.PathLike[str]] | None = None
) -> dict[str, Path]:
    """Copy a captured checkpoint back where its files came from (or to ``targets``).

    Every file is re-hashed while copied and must match the manifest; each target is
    assembled beside its final place and swapped in by rename, so the script never sees
    half a checkpoint, and a failed restore leaves what was there. Returns name -> path.
    """
    listing = sources_of(info)
    if not listing:
        raise UserError(f"checkpoint step {info.step} at {info.path} holds no captured files")
    placed: dict[str, Path] = {}
    for name, entry in listing.items():
        dest = Path((targets or {}).get(name) or entry["path"])
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".{dest.name}.acceptrun-{os.getpid()}-{secrets.token_hex(3)}"
        prefix = f"{PREFIX}/{name}"
        where = f"checkpoint step {info.step} manifest entry under {prefix!r}"
        try:
            if entry.get("type") == "dir":
                tmp.mkdir()
                for arc, rec in info.files.items():
                    if arc.startswith(prefix + "/"):
                        # Manifest names are data: each stays inside the checkpoint it is
                        # read from and inside the directory it is restored into.
                        src = confine(info.path, arc, field=where, within="the checkpoint",
                                      error=RecordError)  # fmt: skip
                        out = confine(tmp, arc[len(prefix) + 1 :], field=where,
                                      within="the restore target", error=RecordError)  # fmt: skip
                        _copy_checked(src, out, rec)
                _swap_dir(tmp, dest)
            else:
                src = confine(
                    info.path, prefix, field=where, within="the checkpoint", error=RecordError
                )
                _copy_checked(src, tmp, info.files[prefix])
                os.replace(tmp, dest)
            fsync_dir(dest.parent)
        except BaseException:
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
            raise
        placed[name] = dest
    return placed


def _copy_checked(src: Path, dest: Path, record: Mapping[str, Any]) -> None:
    """Copy one stored file, hashing what is read; it must match its manifest entry."""
    algorithm, _ = split_hash(str(record["hash"]))
    hasher = new_hasher(algorithm)
    size = 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as fin, dest.open("wb") as fout:
        while chunk := fin.read(_CHUNK):
            hasher.update(chunk)
            fout.write(chunk)
            size += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    got = f"{algorithm}:{hasher.hexdigest()}"
    if got != record["hash"] or size != record["size"]:
        raise RecordError(
            f"{src} does not match its manifest while being restored ({size} bytes, {got}); "
            "verify the checkpoint (`acceptrun ckpt verify RUN`) and resume from another"
        )


def _swap_dir(tmp: Path, dest: Path) -> None:
    """Put directory ``tmp`` at ``dest``; an existing ``dest`` is moved aside, then removed."""
    if dest.exists() or dest.is_symlink():
        old = dest.parent / f".{dest.name}.acceptrun-old-{secrets.token_hex(3)}"
        os.rename(dest, old)
        os.rename(tmp, dest)
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()
    else:
        os.rename(tmp, dest)
