"""Data manifests: snapshot a data source, verify it before the first step.

A manifest records the size and content hash of every file under a data source, and a
``root_hash`` over the sorted ``"<path>\\t<size>\\t<hash>\\n"`` lines. The root hash depends
only on relative paths and bytes, never on where the data lives or on mtimes, so a copy of
the tree at another path, on another machine or in an object store has the same root hash.

A source is a local file (its relative path is its basename), a local directory (walked
recursively; symlinks are followed and the target's content is recorded) or any fsspec
URL (``file://``, ``memory://``, ``s3://`` with s3fs installed). Files are streamed in
4 MiB chunks, so memory stays flat and hashing runs at disk or xxh3 speed.

Keep the manifest outside the data directory. If it must live inside, snapshot with
``exclude=["<its relative path>"]`` and verify with ``ignore=["<its path>"]``, so that
rewriting the manifest never makes the data look changed.

>>> write_manifest("data.manifest.json", snapshot("data/"))
>>> result = verify("data/", load_manifest("data.manifest.json"))
>>> print(format_verify(result, manifest_path="data.manifest.json"))
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import posixpath
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from acceptrun._util.durable import loads_json, read_bytes_bounded, write_json_atomic
from acceptrun._util.hashing import ALGORITHM, CHUNK, new_hasher
from acceptrun._util.paths import escape_problem
from acceptrun._util.units import format_bytes
from acceptrun.errors import DataError

# A data manifest lists every file of a data set (about 150 bytes each): 1 GiB is some
# seven million files; past it the file is not a manifest acceptrun wrote.
MAX_DATA_MANIFEST_BYTES = 1 << 30
# A file's signature is trusted only when it last changed this long (ns) before the stat:
# two writes in one tick of the file system's clock would leave the same mtime and ctime.
SETTLE_NS = 2_000_000_000

__all__ = [
    "KIND",
    "SCHEMA",
    "Changed",
    "VerifyResult",
    "format_verify",
    "load_manifest",
    "snapshot",
    "stat_signatures",
    "verify",
    "write_manifest",
]

KIND = "acceptrun.data-manifest"
SCHEMA = 1
Progress = Callable[[int, int], None]
"""``progress(done_bytes, total_bytes)``, called after each chunk hashed."""

_REQUIRED = ("schema", "kind", "source", "algorithm", "files", "root_hash")
_MAX_NAMED = 5  # paths per kind named in a one-line summary
_MAX_LINES = 50  # paths per kind listed by format_verify; the rest are counted
_REMAKE = "re-create it with `acceptrun data snapshot <data path> -o <manifest>`"


@dataclass(frozen=True)
class Changed:
    """A file whose size or content differs from the manifest (sizes in bytes)."""

    path: str
    expected_size: int
    found_size: int
    expected_hash: str
    found_hash: str | None
    """``None`` when the size already differed, so the file was not read."""


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of :func:`verify`; ``ok`` is true when no file is missing, extra or changed."""

    ok: bool
    source: str
    root_hash: str | None
    """Root hash of the data found; ``None`` when not every file was hashed (extra or
    resized files are not read)."""
    expected_root_hash: str
    count: int
    """Files found in the source (after excludes and ignores)."""
    checked_bytes: int
    """Bytes read and hashed."""
    seconds: float
    """Wall-clock time of listing and hashing."""
    missing: list[str]
    extra: list[str]
    changed: list[Changed]
    trusted: int = 0
    """Files not read: their stat signature is the one ``trust`` gave (see :func:`verify`)."""
    hashed: int = 0
    """Files read and hashed."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy, for preflight.json and reports."""
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """One line: ``"12 files, 3.4 MB verified in 0.05 s, root xxh3_128:abcd1234..."``."""
        if self.ok:
            noun = "file" if self.count == 1 else "files"
            algorithm = (self.root_hash or "").partition(":")[0]
            return (
                f"{self.count} {noun}, {format_bytes(self.checked_bytes, decimal=True)} verified in "
                f"{self.seconds:.2f} s, root {algorithm}:{_short(self.root_hash or '')}."
            )
        kinds = [
            ("missing", self.missing),
            ("extra", self.extra),
            ("changed", [c.path for c in self.changed]),
        ]
        counts = ", ".join(f"{len(paths)} {kind}" for kind, paths in kinds if paths)
        named = "; ".join(f"{kind} {_name_some(paths)}" for kind, paths in kinds if paths)
        return f"{counts}: {named}"


def snapshot(
    source: str | Path,
    *,
    algorithm: str = ALGORITHM,
    exclude: Sequence[str] = (),
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Hash every file of ``source`` into a manifest dict (see the module docstring).

    ``exclude`` holds fnmatch globs on the relative posix path; ``*`` also matches ``/``
    and a pattern that matches a directory skips all of it (``"*.tmp"``, ``"cache"``).
    The globs are stored in the manifest so :func:`verify` skips the same files.

    >>> snapshot("data/", exclude=["*.tmp"])["root_hash"]
    'xxh3_128:...'
    """
    _check_algorithm(algorithm, f"snapshot of {source}")
    listing = _list_source(source, exclude)
    paths = sorted(listing.files)
    total = sum(size or 0 for _, size in listing.files.values())
    hashed = _hash_files(listing, paths, algorithm, progress, total)
    files = {path: {"size": size, "hash": digest} for path, (digest, size) in hashed.items()}
    return {
        "schema": SCHEMA,
        "kind": KIND,
        "source": str(source),
        "algorithm": algorithm,
        "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "exclude": list(exclude),
        "count": len(files),
        "total_bytes": sum(entry["size"] for entry in files.values()),
        "files": files,
        "root_hash": _root_hash(files, algorithm),
    }


def write_manifest(path: str | Path, manifest: Mapping[str, Any]) -> None:
    """Write ``manifest`` atomically as key-sorted JSON, creating parent directories."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, dict(manifest))


def load_manifest(path: str | Path) -> dict[str, Any]:
    """Read and check a manifest written by :func:`write_manifest`.

    Raises :class:`DataError` naming the file when it is missing, is not JSON, is not a
    data manifest, or its ``root_hash`` does not match its files (edited or damaged).
    """
    try:
        text = read_bytes_bounded(path, MAX_DATA_MANIFEST_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise DataError(
            f"data manifest {path} not found; "
            f"create it with `acceptrun data snapshot <data path> -o {path}`"
        ) from None
    except (OSError, ValueError) as exc:  # unreadable, over the size limit, not UTF-8
        raise DataError(f"cannot read data manifest {path} ({exc}); {_REMAKE}") from exc
    try:
        manifest = loads_json(text, max_bytes=MAX_DATA_MANIFEST_BYTES)
    except ValueError as exc:  # not JSON, nested too deep, too large
        raise DataError(f"data manifest {path} is not valid JSON ({exc}); {_REMAKE}") from exc
    _check_manifest(manifest, f"data manifest {path}")
    checked: dict[str, Any] = manifest
    return checked


def verify(
    source: str | Path,
    manifest: Mapping[str, Any],
    *,
    ignore: Sequence[str] = (),
    progress: Progress | None = None,
    trust: Mapping[str, Sequence[int]] | None = None,
) -> VerifyResult:
    """Compare ``source`` with ``manifest``; only a missing or unreadable source raises.

    A file whose size differs is reported changed without reading it; a file of the same
    size is hashed with the manifest's own algorithm. ``ignore`` names files to leave out
    on both sides, either as manifest paths (``"manifest.json"``) or as paths or URLs that
    lie inside the source (``"data/manifest.json"``): use it for a manifest kept inside
    the data directory. ``trust`` maps paths to the stat signatures
    (:func:`stat_signatures`) they had when they were last verified: a local file whose
    signature is unchanged is taken as verified without reading it (one stat, no hash).

    >>> verify("data/", load_manifest("data.manifest.json")).ok
    True
    """
    started = time.perf_counter()
    _check_manifest(manifest, f"data manifest for {source}")
    algorithm: str = manifest["algorithm"]
    listing = _list_source(source, manifest.get("exclude", ()))
    skip = _ignored_paths(source, listing, ignore)
    found = {path: size for path, (_, size) in listing.files.items() if path not in skip}
    expected = {path: e for path, e in manifest["files"].items() if path not in skip}

    changed: list[Changed] = []
    to_hash: list[str] = []
    trusted = 0
    for path in sorted(found.keys() & expected.keys()):
        size, want = found[path], expected[path]
        # A signature that is not a list (a damaged data_stats.json) trusts nothing: hashed.
        sig = trust.get(path) if trust is not None else None
        if isinstance(sig, list) and sig and _signature(listing, path) == sig:
            trusted += 1  # unchanged since it was last hashed: a stat, not a read
        elif size is not None and size != want["size"]:
            # Fast path: a resized file is changed whatever its bytes; skip reading it.
            changed.append(Changed(path, want["size"], size, want["hash"], None))
        else:
            to_hash.append(path)
    total = sum(found[path] or 0 for path in to_hash)
    hashed = _hash_files(listing, to_hash, algorithm, progress, total)
    for path, (digest, size) in hashed.items():
        want = expected[path]
        if size != want["size"] or digest != want["hash"]:
            changed.append(Changed(path, want["size"], size, want["hash"], digest))
    changed.sort(key=lambda c: c.path)

    root = None
    if len(hashed) == len(found) and not trusted:  # every file was read: its root is known
        files = {path: {"size": size, "hash": digest} for path, (digest, size) in hashed.items()}
        root = _root_hash(files, algorithm)
    missing = sorted(expected.keys() - found.keys())
    extra = sorted(found.keys() - expected.keys())
    return VerifyResult(
        ok=not (missing or extra or changed),
        source=str(source),
        root_hash=root,
        expected_root_hash=manifest["root_hash"],
        count=len(found),
        checked_bytes=sum(size for _, size in hashed.values()),
        seconds=time.perf_counter() - started,
        missing=missing,
        extra=extra,
        changed=changed,
        trusted=trusted,
        hashed=len(hashed),
    )


def stat_signatures(
    source: str | Path, exclude: Sequence[str] = (), *, now_ns: int | None = None
) -> dict[str, list[int]] | None:
    """``{relative path: [size, mtime_ns, inode, ctime_ns]}`` of a local source's files.

    One ``stat`` per file, no read: what :func:`verify` compares with ``trust`` to skip a
    file that has not changed since. Take it *before* hashing the files it vouches for.
    A rewrite in place changes ``mtime_ns`` and ``ctime_ns``; a file replaced by another
    changes the inode; setting the mtime back by hand still changes ``ctime_ns``. A file
    changed less than :data:`SETTLE_NS` before ``now_ns`` (default: now) is left out, so
    it is hashed again: file systems stamp times from a coarse clock (a few ms, an NFS
    server's own clock), and a second write in the same tick would keep the signature.
    None for a remote (fsspec) source, which has no such signature.
    """
    now = time.time_ns() if now_ns is None else now_ns
    listing = _list_source(source, exclude)
    if listing.fs is not None:
        return None
    return {
        path: list(sig)
        for path, sig in listing.stats.items()
        if max(sig[1], sig[3]) < now - SETTLE_NS
    }


def _signature(listing: _Listing, path: str) -> list[int] | None:
    sig = listing.stats.get(path)
    return None if sig is None else list(sig)


def format_verify(result: VerifyResult, *, manifest_path: str | Path | None = None) -> str:
    """Multi-line text for a terminal: a headline, one line per difference, and the fix.

    ``manifest_path`` fills in the refresh command; without it the command says ``<manifest>``.
    """
    if result.ok:
        return f"data {result.source} matches its manifest: {result.summary()}"
    counts = result.summary().partition(":")[0]
    lines = [f"data {result.source} does not match its manifest: {counts}"]
    lines += _listed("missing", result.missing)
    lines += _listed("extra", result.extra)
    lines += _listed("changed", [_describe(c) for c in result.changed])
    target = manifest_path if manifest_path is not None else "<manifest>"
    lines.append(
        "if the change is intended, refresh the manifest: "
        f"acceptrun data snapshot {result.source} -o {target}"
    )
    return "\n".join(lines)


# --- listing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Listing:
    """The files of a source: relative posix path -> (location, size in bytes or None)."""

    root: str
    fs: Any  # an fsspec filesystem; None for the local disk, read with plain open()
    files: dict[str, tuple[str, int | None]]
    stats: dict[str, tuple[int, int, int, int]] = dataclasses.field(default_factory=dict)
    """Local files only: (size, mtime_ns, inode, ctime_ns) from the listing's own stat."""

    def chunks(self, location: str) -> Iterator[bytes]:
        """Stream a file in CHUNK-sized pieces; never holds a whole file in memory."""
        opener = self.fs.open if self.fs is not None else open
        with opener(location, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk


def _list_source(source: str | Path, exclude: Sequence[str]) -> _Listing:
    text = str(source)
    try:
        if isinstance(source, str) and ("://" in source or "::" in source):
            import fsspec  # lazily: plain paths never pay for importing fsspec
            from fsspec.implementations.local import LocalFileSystem

            fs, root = fsspec.core.url_to_fs(source)
            if not isinstance(fs, LocalFileSystem):
                return _list_fsspec(fs, root, text, exclude)
            return _list_local(Path(root), text, exclude)  # file:// follows symlinks too
        return _list_local(Path(text), text, exclude)
    except OSError as exc:  # permissions, object-store credentials, network
        raise DataError(
            f"cannot list data source {source} ({exc}); check access to it, or exclude "
            "the unreadable part"
        ) from exc


def _list_local(root: Path, source: str, exclude: Sequence[str]) -> _Listing:
    if not root.exists():
        if root.is_symlink():
            raise _broken_link(str(root), source)
        raise _not_found(source)
    files: dict[str, tuple[str, int | None]] = {}
    stats: dict[str, tuple[int, int, int, int]] = {}
    if not root.is_dir():
        _add_local(files, stats, root.name, str(root), root.stat())
        return _Listing(str(root), None, files, stats)
    # Depth-first with the chain of directories above each one, to catch symlink loops
    # while still following two links to the same directory (both are data).
    stack: list[tuple[str, str, frozenset[tuple[int, int]]]] = [(str(root), "", frozenset())]
    while stack:
        dirpath, prefix, above = stack.pop()
        st = os.stat(dirpath)
        key = (st.st_dev, st.st_ino)
        if key in above:
            raise DataError(
                f"{dirpath} is a symlink loop back to one of its parent directories; "
                f"remove the link or skip it with exclude=[{prefix.rstrip('/')!r}]"
            )
        with os.scandir(dirpath) as entries:
            for entry in entries:
                rel = prefix + entry.name
                if _excluded(rel, exclude):
                    continue
                if entry.is_dir():  # follows symlinks
                    stack.append((entry.path, rel + "/", above | {key}))
                    continue
                try:
                    info = entry.stat()  # follows symlinks
                except FileNotFoundError:
                    if entry.is_symlink():
                        raise _broken_link(entry.path, source) from None
                    continue  # deleted while listing: absent, like any missing file
                _add_local(files, stats, rel, entry.path, info)
    return _Listing(str(root), None, files, stats)


def _add_local(
    files: dict[str, tuple[str, int | None]],
    stats: dict[str, tuple[int, int, int, int]],
    rel: str,
    path: str,
    info: os.stat_result,
) -> None:
    if not stat.S_ISREG(info.st_mode):
        # A FIFO or device would block or never end when read.
        raise DataError(
            f"{path} is not a regular file (a FIFO, socket or device); "
            f"skip it with exclude=[{rel!r}]"
        )
    files[rel] = (path, info.st_size)
    stats[rel] = (info.st_size, info.st_mtime_ns, info.st_ino, info.st_ctime_ns)


def _list_fsspec(fs: Any, root: str, source: str, exclude: Sequence[str]) -> _Listing:
    if not fs.exists(root):
        raise _not_found(source)
    files: dict[str, tuple[str, int | None]] = {}
    if not fs.isdir(root):
        size = fs.info(root).get("size")
        files[posixpath.basename(root.rstrip("/"))] = (root, size)
        return _Listing(root, fs, files)
    prefix = root.rstrip("/") + "/"
    for name, info in fs.find(root, detail=True).items():
        rel = name[len(prefix) :] if name.startswith(prefix) else posixpath.relpath(name, root)
        if not _excluded(rel, exclude):
            files[rel] = (name, info.get("size"))
    return _Listing(root, fs, files)


def _excluded(rel: str, patterns: Sequence[str]) -> bool:
    """Whether ``rel`` or one of its parent directories matches one of ``patterns``."""
    if not patterns:
        return False
    parts = rel.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(c, p.rstrip("/") or p) for p in patterns for c in candidates)


def _ignored_paths(source: str | Path, listing: _Listing, ignore: Sequence[str]) -> set[str]:
    """Map each ``ignore`` entry to the relative path(s) it may name inside the source."""
    paths: set[str] = set()
    base = str(source).rstrip("/") + "/"
    for item in ignore:
        text = str(item)
        paths.add(PurePosixPath(text).as_posix())  # a manifest path, "./" tolerated
        if text.startswith(base):  # a path or URL spelled like the source
            paths.add(PurePosixPath(text[len(base) :]).as_posix())
        if listing.fs is None and "://" not in text:  # a local path from anywhere
            rel = os.path.relpath(os.path.abspath(text), os.path.abspath(listing.root))
            if not rel.startswith(".."):
                paths.add(Path(rel).as_posix())
    return paths


# --- hashing ---------------------------------------------------------------------------


def _hash_files(
    listing: _Listing,
    paths: Sequence[str],
    algorithm: str,
    progress: Progress | None,
    total: int,
) -> dict[str, tuple[str, int]]:
    """Hash ``paths`` in order; returns path -> (hash, bytes read)."""
    done = 0
    hashed: dict[str, tuple[str, int]] = {}
    for path in paths:
        location = listing.files[path][0]
        hasher = new_hasher(algorithm)
        size = 0
        try:
            for chunk in listing.chunks(location):
                hasher.update(chunk)
                size += len(chunk)
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
        except OSError as exc:
            raise DataError(
                f"cannot read {location} in data source {listing.root} ({exc}); "
                "check that it exists and is readable, or exclude it"
            ) from exc
        hashed[path] = (f"{algorithm}:{hasher.hexdigest()}", size)
    if progress is not None and (done != total or not paths):
        progress(done, done)  # files changed size while hashing, or there were none: close at 100%
    return hashed


def _root_hash(files: Mapping[str, Mapping[str, Any]], algorithm: str) -> str:
    hasher = new_hasher(algorithm)
    for path in sorted(files):
        entry = files[path]
        line = f"{path}\t{entry['size']}\t{entry['hash']}\n"
        hasher.update(line.encode("utf-8", "surrogateescape"))  # undecodable names survive
    return f"{algorithm}:{hasher.hexdigest()}"


# --- checks and messages ---------------------------------------------------------------


def _check_algorithm(algorithm: Any, where: str) -> None:
    try:
        new_hasher(algorithm)
    except (ValueError, TypeError):
        raise DataError(
            f"{where}: unknown hash algorithm {algorithm!r}; use {ALGORITHM!r} or 'sha256'"
        ) from None


def _check_manifest(manifest: Any, where: str) -> None:
    """Raise DataError naming ``where`` and the problem unless ``manifest`` is well formed."""

    def bad(problem: str) -> DataError:
        return DataError(f"{where} {problem}; {_REMAKE}")

    if not isinstance(manifest, Mapping):
        raise bad(f"is a JSON {type(manifest).__name__}, not an object")
    if manifest.get("kind") != KIND:
        raise bad(f"has kind {manifest.get('kind')!r}, expected {KIND!r}")
    absent = [key for key in _REQUIRED if key not in manifest]
    if absent:
        raise bad(f"lacks key(s) {', '.join(absent)}")
    if manifest["schema"] != SCHEMA:
        raise bad(f"has schema {manifest['schema']!r}; this acceptrun reads schema {SCHEMA}")
    algorithm = manifest["algorithm"]
    _check_algorithm(algorithm, where)
    exclude = manifest.get("exclude", [])
    if not (isinstance(exclude, list) and all(isinstance(p, str) for p in exclude)):
        raise bad(f"has exclude {exclude!r}, expected a list of glob strings")
    files = manifest["files"]
    if not isinstance(files, dict):
        raise bad(f"has files of type {type(files).__name__}, expected an object")
    for path, entry in files.items():
        # Entries are names inside the data: one that leads out of it ("../../etc/passwd",
        # "/etc/passwd") is a corrupt manifest, never a file to look for elsewhere.
        if why := escape_problem(path):
            raise bad(f"has an entry {path!r} that is not a path inside the data ({why})")
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("size"), int)
            and isinstance(entry.get("hash"), str)
            and entry["hash"].startswith(f"{algorithm}:")
        ):
            raise bad(
                f"has a malformed entry for {path!r}: {entry!r} "
                f"(expected {{'size': <bytes>, 'hash': '{algorithm}:<hex>'}})"
            )
    if _root_hash(files, algorithm) != manifest["root_hash"]:
        raise bad(
            f"has root_hash {manifest['root_hash']!r} that does not match its files "
            "(it was edited or damaged)"
        )


def _not_found(source: str) -> DataError:
    return DataError(
        f"data source {source} does not exist; check the spec's data.path "
        "(a local path, or an fsspec URL such as s3://bucket/prefix)"
    )


def _broken_link(path: str, source: str) -> DataError:
    return DataError(
        f"{path} in data source {source} is a broken symlink (to {os.readlink(path)}); "
        "restore its target, remove the link, or exclude it"
    )


def _describe(change: Changed) -> str:
    if change.found_hash is None:
        return f"{change.path} (size {change.expected_size} -> {change.found_size})"
    return (
        f"{change.path} (size {change.expected_size} -> {change.found_size}, hash "
        f"{_short(change.expected_hash)} -> {_short(change.found_hash)})"
    )


def _listed(kind: str, items: list[str]) -> list[str]:
    lines = [f"  {kind}: {item}" for item in items[:_MAX_LINES]]
    if len(items) > _MAX_LINES:
        lines.append(f"  {kind}: ... and {len(items) - _MAX_LINES} more")
    return lines


def _name_some(paths: list[str]) -> str:
    named = ", ".join(paths[:_MAX_NAMED])
    more = len(paths) - _MAX_NAMED
    return f"{named} (+{more} more)" if more > 0 else named


def _short(value: str) -> str:
    """``"xxh3_128:abcd1234ef..."`` -> ``"abcd1234.."``: enough to tell hashes apart."""
    return value.partition(":")[2][:8] + ".."
