"""Declared outputs: the ``[outputs]`` of the spec, checked at the end of every attempt.

A script that does not call ``run.output()`` names its outputs in the spec instead
(``[outputs] model = "out/model.pt"``). When an attempt's process has exited, the
supervisor checks each entry as ``run.output()`` does (the file exists, is not empty, is
hashed) and writes an ``output`` event with its lineage: run id, attempt, the last step
the attempt logged, path, size and hash, plus ``"source": "spec"``. The verdict's output
check (``acceptance.outputs``) then verifies that hash again at close, as for a
registered output.

Why at the end of each attempt, in the supervisor: the files are complete then (their
writer has exited), a failed attempt's outputs are on record too, and the last attempt's
event is the newest one, which is what the verdict reads.

- A glob that matches several files registers the **newest** (by modification time) under
  the entry's name, with ``matched`` (how many matched): ``checkpoint-*/model.pt`` names
  the final one. Name each file in its own entry to keep several.
- A file last modified before the run was launched is not this run's output: a stale file
  from an earlier run never passes as a result.
- A missing, empty or stale output is an ``output_missing`` event with the reason; the
  verdict fails a required output whose newest event is one.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

from acceptrun._util.hashing import hash_file
from acceptrun._util.paths import inside, lexical_problem
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec

__all__ = ["check_declared_outputs", "find_output"]

MTIME_SLACK_S = 1.0  # file systems with coarse timestamps: a file written at launch is ours


def find_output(spec: RunSpec, pattern: str, since: float) -> tuple[Path | None, int, str]:
    """(newest file matching ``pattern``, how many matched, why none) for one entry."""
    base = spec.workdir_path
    why = lexical_problem(pattern)  # the spec refuses these; a record frozen before did not
    if why is not None:
        return None, 0, f"{pattern!r} is not a path inside the workdir {base}: {why}"
    full = str(base / pattern)
    matches = [Path(p) for p in glob.glob(full, recursive=True)] if glob.has_magic(pattern) else (
        [Path(full)] if os.path.lexists(full) else []
    )  # fmt: skip
    files = [p for p in matches if p.is_file()]
    # Only files of the workdir: "../x", an absolute path or a symlink that leads out is
    # never hashed and recorded as this run's result.
    root = base.resolve()
    outside = [p for p in files if not inside(root, p)]
    files = [p for p in files if p not in outside]
    if not files and outside:
        real = outside[0].resolve()
        why = f"{outside[0]} resolves to {real}, outside the workdir {root}"
        return None, len(matches), f"{why}: an output must be a file the run writes in its workdir"
    if not files:
        if matches:
            return None, len(matches), f"{matches[0]} is a directory: name a file inside it"
        return None, 0, f"no file at {full}"
    newest = max(files, key=lambda p: p.stat().st_mtime)
    st = newest.stat()
    if st.st_size == 0:
        return None, len(files), f"{newest} is empty"
    if st.st_mtime < since - MTIME_SLACK_S:
        return None, len(files), f"{newest} was last written before this run started"
    return newest, len(files), ""


def check_declared_outputs(
    record: RunRecord, spec: RunSpec, attempt: int, *, step: int | None, since: float
) -> list[dict[str, Any]]:
    """An ``output`` or ``output_missing`` event per ``[outputs]`` entry; returns them."""
    events = []
    for name, pattern in spec.outputs.items():
        try:
            path, matched, why = find_output(spec, pattern, since)
            if path is None:
                events.append(record.event(
                    "output_missing", sync=True, attempt=attempt, name=name, pattern=pattern,
                    reason=why, matched=matched,
                ))  # fmt: skip
                continue
            digest, size = hash_file(path)
        except OSError as exc:  # vanished between the glob and the hash, unreadable
            events.append(record.event(
                "output_missing", sync=True, attempt=attempt, name=name, pattern=pattern,
                reason=f"cannot read it: {exc}",
            ))  # fmt: skip
            continue
        events.append(record.event(
            "output", sync=True, run_id=record.run_id, attempt=attempt, step=step, name=name,
            path=str(path), hash=digest, size=size, source="spec", pattern=pattern,
            matched=matched,
        ))  # fmt: skip
    return events
