"""The order of a store's commits, and every step number it has ever used.

A step number says which training step a checkpoint holds; it is not always the order
in which checkpoints were written. A script's own checkpoint (``checkpoint.watch``) is
dated by the steps its script reported, and those can go back (a counter that restarts
every epoch, a counter restarted by a resume that nothing could tell apart), or be an
estimate proven later (a TensorBoard writer that flushes every two minutes). Ordered by
step, the newest capture could then sit under the lowest step and retention would keep
the wrong ones; a step deleted by retention could be taken again by another capture.

So every commit gets a **sequence number** (``sequence`` in its manifest), one more than
any commit before it in the store, and one line is appended to ``COMMITS`` in the store
root before the commit's rename: ``{"seq": n, "step": s}``. A re-date
(:meth:`~acceptrun.checkpoint.store.CheckpointStore.redate`) keeps the sequence number
and appends the new step under it. From that log:

- the **true order** of the checkpoints is their sequence order (:func:`true_order`);
  manifests written before sequences existed come first, by step;
- a step is **taken** while it is the current step of any commit ever made, deleted by
  retention or quarantined included; a step a re-date moved away from is free again
  (the estimate was wrong; the checkpoint that truly holds it may take it).

The log is read whole (one short line per commit) and read tolerantly: a line that is
not a commit record is skipped, and a log that cannot be read at all (removed, a link,
not a regular file) leaves the manifests in the root as the only source, so a damaged
log costs the memory of deleted steps. A commit that cannot append its line (``COMMITS``
made a link, a FIFO or a directory) fails with a :class:`RecordError` naming the file
and the fix, before anything of it appears: never a hang, never a step written unlogged.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from acceptrun._util.durable import jsonl_line, read_bytes_bounded, write_appended
from acceptrun.errors import RecordError

__all__ = ["COMMITS", "CommitLog", "true_order"]

COMMITS = "COMMITS"
_LOG_MAX = 16 << 20  # bytes: about 500,000 commits; a longer log is read as none


class CommitLog:
    """``COMMITS`` of one store root: sequence numbers and the steps they hold."""

    def __init__(self, root: Path) -> None:
        self.path = root / COMMITS

    def read(self) -> dict[int, int]:
        """Sequence number -> its current step (the last line for it wins)."""
        try:
            raw = read_bytes_bounded(self.path, _LOG_MAX, root=self.path.parent)
        except (OSError, ValueError):
            return {}
        out: dict[int, int] = {}
        for line in raw.splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # a line torn by a crash: the manifests still say the rest
            if isinstance(doc, dict) and _whole_numbers(doc.get("seq"), doc.get("step")):
                out[doc["seq"]] = doc["step"]
        return out

    def next_sequence(self, present: Iterable[int | None]) -> int:
        """One more than any sequence number in the log or among ``present`` manifests."""
        known = [*self.read(), *(s for s in present if s is not None)]
        return max(known, default=0) + 1

    def append(self, seq: int, step: int) -> None:
        """Record that commit ``seq`` holds ``step``: one line, fsynced before it returns."""
        line = jsonl_line({"seq": seq, "step": step})
        # Non-blocking and not through a link: a FIFO planted there must not hang a save.
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            raise self._unusable(exc.strerror or str(exc)) from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise self._unusable("not a regular file")
            write_appended(fd, line, self.path)  # after a line torn by a crash, a new one
            os.fsync(fd)
        finally:
            os.close(fd)

    def _unusable(self, why: str) -> RecordError:
        return RecordError(
            f"{self.path}: the checkpoint store's commit log cannot be appended to ({why}); "
            "move it away (a new one is started, and the steps it held are read from the "
            "checkpoints left) and save again"
        )


def true_order(infos: Iterable[Any]) -> list[Any]:
    """Checkpoints oldest first by when they were committed (``sequence``), else by step."""
    return sorted(
        infos,
        key=lambda i: (0, i.step, 0) if i.sequence is None else (1, i.sequence, i.step),
    )


def _whole_numbers(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)
