"""One checkpoint save in progress: files hashed as they are written, then fsynced.

:class:`CheckpointWriter` is what :meth:`CheckpointStore.begin
<acceptrun.checkpoint.store.CheckpointStore.begin>` returns: it writes into the save's
staging directory, hashes every byte the kernel accepted (so a commit costs no re-read),
fsyncs each file on close and abandons the whole save on any error. The store commits it
(checkpoint/store.py): the manifest, the rename, LATEST.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from acceptrun._util.hashing import ALGORITHM, new_hasher
from acceptrun._util.paths import escape_problem
from acceptrun.errors import DiskFullError, RecordError, UserError

if TYPE_CHECKING:
    from acceptrun.checkpoint.store import CheckpointStore

__all__ = ["MANIFEST", "CheckpointWriter", "valid_name"]

MANIFEST = "MANIFEST.json"  # written by the store at the commit: no file of a save may take it
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_BUFFER = 1 << 20  # bytes buffered per open file; larger writes go straight through


class _HashingFile(io.FileIO):
    """A write-only file that hashes exactly the bytes the kernel accepted.

    Hashing while writing saves a full re-read per commit but only holds for sequential
    writes, so the file is not seekable (torch.save and zipfile cope with that).
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path, "x")  # O_EXCL: never write into a file someone else made
        self.hasher = new_hasher(ALGORITHM)
        self.size = 0

    def write(self, b: Any, /) -> int:
        n = super().write(b)
        if n:  # xxhash takes any buffer: hash the accepted prefix without copying it
            self.hasher.update(cast(bytes, memoryview(b).cast("B")[:n]))
            self.size += n
        return n

    def seekable(self) -> bool:
        return False  # so BufferedWriter refuses seek() and truncate()


def valid_name(name: str) -> bool:
    # The one rule for names read from a manifest (acceptrun._util.paths), and canonical.
    return escape_problem(name) is None and str(PurePosixPath(name)) == name


class CheckpointWriter:
    """One save in progress, in a staging directory of the root (from ``store.begin``).

    ``state`` is "open", then "committed" or "aborted".
    """

    def __init__(
        self, store: CheckpointStore, step: int, path: Path, *, owner: bool = True
    ) -> None:
        self.step = step
        self.path = path
        self.state = "open"
        self.owner = owner  # False: another process's save, joined to write some files
        self.store = store
        self.files: dict[str, dict[str, Any]] = {}
        self.dirs: set[Path] = set()  # subdirectories made here, fsynced before the manifest
        self.started = time.monotonic()

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[BinaryIO]:
        """A new file ``name`` (may contain "/"), hashed as written and fsynced on close.

        An exception inside the block abandons the whole save (the staging directory is
        removed): half a checkpoint is never worth keeping, and a full disk needs the space.
        """
        self.require_open()
        if not valid_name(name) or name == MANIFEST:
            raise UserError(
                f"checkpoint file name {name!r} is not allowed; use a relative path such as "
                f"'model/weights.safetensors' (no '..', no leading '/', not {MANIFEST!r})"
            )
        if name in self.files:
            raise UserError(f"checkpoint file {name!r} was already written in step {self.step}")
        target = self.path / name
        for parent in reversed(PurePosixPath(name).parents[:-1]):  # "a", then "a/b"
            if not (self.path / parent).is_dir():
                (self.path / parent).mkdir()
                self.dirs.add(self.path / parent)
        try:
            raw = _HashingFile(target)
            buffered = io.BufferedWriter(raw, buffer_size=_BUFFER)
            try:
                yield buffered
                buffered.flush()
                # The manifest written later must never describe bytes still only in the
                # page cache: after a power cut that would be a "committed" file of zeros.
                os.fsync(raw.fileno())
            finally:
                with contextlib.suppress(OSError):  # after a failed flush, close fails too
                    buffered.close()
        except BaseException as exc:
            self.store.abort(self)
            if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
                raise DiskFullError(  # a UserError, and the OSError it was before
                    f"could not write checkpoint file {target}: {exc.strerror}; the save of "
                    f"step {self.step} was abandoned and earlier checkpoints are intact. "
                    "Free disk space (or raise the file-size limit) and retry.",
                    errno=exc.errno, directory=str(self.store.root),
                ) from exc  # fmt: skip
            raise
        self.files[name] = {"size": raw.size, "hash": f"{ALGORITHM}:{raw.hasher.hexdigest()}"}

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write a whole file at once (for example ``safetensors.torch.save(tensors)``)."""
        with self.open(name) as f:
            f.write(data)

    def write_json(self, name: str, obj: Any) -> None:
        """Write ``obj`` as key-sorted JSON (trainer state, data-loader position, ...)."""
        self.write_bytes(name, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())

    def written(self) -> tuple[dict[str, dict[str, Any]], builtins.list[str]]:
        """The files written so far (name -> size and hash) and the directories made.

        What a rank that joined a save reports to the owner, for :meth:`adopt`.
        """
        dirs = sorted(d.relative_to(self.path).as_posix() for d in self.dirs)
        return {k: dict(v) for k, v in self.files.items()}, dirs

    def adopt(self, files: Mapping[str, Mapping[str, Any]], dirs: builtins.list[str]) -> None:
        """Count files another process wrote (and fsynced) into this save as its own.

        ``files`` and ``dirs`` are that process's :meth:`written`; each file must exist
        with the size reported, and no name may be written twice. The hashes are taken
        as reported (they were computed while writing); ``verify`` re-checks them.
        """
        self.require_open()
        for name, entry in files.items():
            if not valid_name(name) or name == MANIFEST or name in self.files:
                raise UserError(f"checkpoint file {name!r} of step {self.step} cannot be adopted")
            size = os.lstat(self.path / name).st_size
            if size != entry.get("size"):
                raise RecordError(
                    f"{self.path / name}: {size} bytes, but its writer reported "
                    f"{entry.get('size')}; the save of step {self.step} is abandoned"
                )
            self.files[name] = {"size": int(entry["size"]), "hash": str(entry["hash"])}
        for d in dirs:
            if not valid_name(d):
                raise UserError(f"checkpoint directory {d!r} cannot be adopted")
            self.dirs.add(self.path / d)

    def require_open(self) -> None:
        """Raise :class:`UserError` unless the save is still open (not committed or aborted)."""
        if self.state != "open":
            raise UserError(f"the save of step {self.step} was already {self.state}")
