"""Every reader of a file acceptrun did not just write itself, on hostile content.

Depth bombs (arrays and objects nested 100,000 deep: RecursionError inside the parser),
nesting just past the limit (deep enough to break a later recursive reader), size bombs
(a file past the size limit, sparse so the test writes nothing), invalid UTF-8 and junk:
each reader must refuse the content as damaged, naming the file, never raise anything
else. The readers are listed beside the files they read; the damage is applied to every
one. Also: a torn events.jsonl followed by an append reads back every whole event, the
new one and a record of the repair; a write that a full file system cuts short (a real
ENOSPC on a file-size limit) raises instead of leaving a silent torn line.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.campaign import tally

from acceptrun._util.durable import (
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_JSONL_LINE_BYTES,
    AppendLog,
    append_jsonl,
    loads_json,
    read_json,
    read_jsonl,
)
from acceptrun.capture.data import load_manifest
from acceptrun.checkpoint.restore import _read_meta
from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.cost.catalog import load_catalog
from acceptrun.errors import AcceptrunError
from acceptrun.record.view import RecordView
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.load import MAX_TOML_BYTES, load_spec

DEEP = 100_000


def _json_bombs(limit: int) -> dict[str, Callable[[Path], None]]:
    """Damage for a JSON file: each writes ``path``."""
    return {
        "depth-bomb-arrays": lambda p: p.write_text("[" * DEEP + "]" * DEEP),
        "depth-bomb-objects": lambda p: p.write_text('{"a":' * DEEP + "1" + "}" * DEEP),
        "just-past-depth": lambda p: p.write_text(
            "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
        ),
        "size-bomb": lambda p: os.truncate(_touch(p), limit + 1),  # sparse: nothing written
        "bad-utf8": lambda p: p.write_bytes(b'{"kind": "\xff\xfe\xc3("}'),
        "junk": lambda p: p.write_bytes(b"\x00\x01{[\x7f" * 64),
    }


def _touch(p: Path) -> Path:
    p.write_bytes(b"")
    return p


def _toml_bombs() -> dict[str, Callable[[Path], None]]:
    return {
        "depth-bomb-arrays": lambda p: p.write_text("a = " + "[" * DEEP + "]" * DEEP + "\n"),
        "depth-bomb-tables": lambda p: p.write_text("a = " + "{b = " * DEEP + "1" + "}" * DEEP),
        "just-past-depth": lambda p: p.write_text(
            "a = " + "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1) + "\n"
        ),
        "size-bomb": lambda p: os.truncate(_touch(p), MAX_TOML_BYTES + 1),
        "bad-utf8": lambda p: p.write_bytes(b'name = "\xff\xfe"\n'),
    }


# ---- the readers, each with the file it reads --------------------------------------------


def _record_json(tmp: Path) -> tuple[Path, Callable[[], Any]]:
    return tmp / "verdict.json", lambda: read_json(tmp / "verdict.json")


def _run_state(tmp: Path) -> tuple[Path, Callable[[], Any]]:
    return tmp / "run.json", lambda: RunRecord(tmp).state


def _exit_json(tmp: Path) -> tuple[Path, Callable[[], Any]]:
    (tmp / "attempts" / "1").mkdir(parents=True)
    return tmp / "attempts/1/exit.json", lambda: RecordView(tmp).attempts()


def _data_manifest(tmp: Path) -> tuple[Path, Callable[[], Any]]:
    return tmp / "data.json", lambda: load_manifest(tmp / "data.json")


def _state_json(tmp: Path) -> tuple[Path, Callable[[], Any]]:
    return tmp / "state.json", lambda: _read_meta(tmp / "state.json")


JSON_READERS = {
    "record JSON (read_json)": _record_json,
    "run.json (RunRecord.state)": _run_state,
    "exit.json (RecordView)": _exit_json,
    "data manifest": _data_manifest,
    "training state.json": _state_json,
}


def _spec(tmp: Path) -> tuple[Path, Callable[[], Any]]:
    return tmp / "spec.toml", lambda: load_spec(tmp / "spec.toml")


def _prices(tmp: Path) -> tuple[Path, Callable[[], Any]]:
    return tmp / "prices.toml", lambda: load_catalog(tmp)


TOML_READERS = {"spec.toml": _spec, "prices.toml": _prices}


def _cases(readers: dict[str, Any], bombs: dict[str, Any]) -> list[Any]:
    return [pytest.param(r, b, id=f"{r}-{b}") for r in readers for b in bombs]


def _refused(read: Callable[[], Any], path: Path) -> str | None:
    """None when the reader refused the damage as an acceptrun error naming the file."""
    try:
        read()
    except AcceptrunError as exc:
        return None if path.name in str(exc) else f"error does not name {path.name}: {exc}"
    except BaseException as exc:  # a traceback for the user: the one thing never allowed
        return f"raised {type(exc).__name__}: {str(exc)[:200]}"
    return "accepted the damaged file"


@pytest.mark.parametrize(("reader", "bomb"), _cases(JSON_READERS, _json_bombs(MAX_JSON_BYTES)))
def test_json_readers_refuse_hostile_content(tmp_path: Path, reader: str, bomb: str) -> None:
    path, read = JSON_READERS[reader](tmp_path)
    limit = (1 << 30) if reader == "data manifest" else MAX_JSON_BYTES
    _json_bombs(limit)[bomb](path)
    problem = _refused(read, path)
    tally("record files (depth/size/encoding)", tried=1, tracebacks=int(problem is not None))
    assert problem is None, problem


@pytest.mark.parametrize(("reader", "bomb"), _cases(TOML_READERS, _toml_bombs()))
def test_toml_readers_refuse_hostile_content(tmp_path: Path, reader: str, bomb: str) -> None:
    path, read = TOML_READERS[reader](tmp_path)
    _toml_bombs()[bomb](path)
    problem = _refused(read, path)
    tally("record files (depth/size/encoding)", tried=1, tracebacks=int(problem is not None))
    assert problem is None, problem


def test_nesting_up_to_the_limit_still_reads() -> None:
    doc = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads_json(doc) == loads_json(doc.encode())
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        loads_json("[" + doc + "]")


# ---- checkpoint metadata -----------------------------------------------------------------


def _store_with_two_steps(root: Path) -> tuple[CheckpointStore, list[tuple[str, dict[str, Any]]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    store = CheckpointStore(root, keep_last=3, on_event=lambda k, f: events.append((k, f)))
    for step in (4, 9):
        writer = store.begin(step)
        writer.write_bytes("weights.bin", bytes([step]) * 64)
        store.commit(writer, metrics={"loss": 1.0 / step})
    return store, events


@pytest.mark.parametrize("bomb", sorted(_json_bombs(MAX_JSON_BYTES)))
def test_corrupt_manifest_is_quarantined_and_the_previous_step_used(
    tmp_path: Path, bomb: str
) -> None:
    store, events = _store_with_two_steps(tmp_path / "ck")
    _json_bombs(MAX_JSON_BYTES)[bomb](tmp_path / "ck" / "step-9" / "MANIFEST.json")
    tracebacks = 0
    try:
        listed = [i.step for i in store.list()]
        good = store.latest_verified()
    except BaseException:
        tracebacks = 1
        raise
    finally:
        tally("checkpoint metadata", tried=1, tracebacks=tracebacks)
    assert listed == [4]
    assert good is not None and good.step == 4
    (quarantined,) = [f for k, f in events if k == "checkpoint_quarantine"]
    assert "step-9/MANIFEST.json" in quarantined["reason"], quarantined
    assert not (tmp_path / "ck" / "step-9").exists()


# ---- events lines ------------------------------------------------------------------------


EVENT_LINE_BOMBS: dict[str, bytes] = {
    "depth-bomb": b"[" * DEEP + b"]" * DEEP + b"\n",
    "object-depth-bomb": b'{"a":' * DEEP + b"1" + b"}" * DEEP + b"\n",
    "just-past-depth": b'{"kind":"step","v":' + b"[" * 70 + b"]" * 70 + b"}\n",
    "overlong": b'{"kind":"step","pad":"' + b"x" * (MAX_JSONL_LINE_BYTES + 10) + b'"}\n',
    "bad-utf8": b'{"kind":"\xff\xfe"}\n',
    "not-an-object": b"[1, 2, 3]\n",
}


@pytest.mark.parametrize("bomb", sorted(EVENT_LINE_BOMBS))
def test_a_damaged_events_line_is_skipped_and_reported(tmp_path: Path, bomb: str) -> None:
    record = RunRecord(tmp_path)
    with open(record.events_path, "wb") as f:
        f.write(b'{"t":1,"kind":"step","step":0}\n')
        f.write(EVENT_LINE_BOMBS[bomb])
        f.write(b'{"t":2,"kind":"step","step":1}\n')
    view = RecordView(record)
    tracebacks = 0
    try:
        steps = [e["step"] for e in view.steps()]
        problems = view.event_problems()
    except BaseException:
        tracebacks = 1
        raise
    finally:
        tally("events lines", tried=1, tracebacks=tracebacks)
    assert steps == [0, 1]
    assert len(problems) == 1 and problems[0].startswith("events.jsonl line 2: "), problems


# ---- storage faults ----------------------------------------------------------------------


@pytest.mark.parametrize("writer", ["AppendLog", "append_jsonl"])
def test_an_append_after_a_torn_line_is_its_own_line(tmp_path: Path, writer: str) -> None:
    path = tmp_path / "events.jsonl"
    whole = [{"t": 1.0, "kind": "attempt_start", "attempt": 1}]
    torn = b'{"t":2.0,"kind":"attempt_exit","attempt":1,"class":"disk_fu'
    path.write_bytes(b"".join(json.dumps(e).encode() + b"\n" for e in whole) + torn)
    new = {"t": 3.0, "kind": "audit", "action": "resume"}
    if writer == "AppendLog":
        log = AppendLog(path)
        log.append(new, sync=True)
        log.close()
    else:
        append_jsonl(path, new, sync=True)
    damaged: list[str] = []
    got = list(read_jsonl(path, damaged=damaged))
    tally("storage faults", tried=1)
    assert got[0] == whole[0] and got[-1] == new, got
    (repair,) = [e for e in got if e["kind"] == "log_repaired"]
    assert repair["torn_bytes"] == len(torn) and repair["offset"] == path.read_bytes().index(torn)
    assert damaged == ["events.jsonl line 2: skipped, " + damaged[0].split(", ", 1)[1]]
    assert torn in path.read_bytes()  # the fragment is kept, as evidence


def test_a_write_cut_short_by_a_full_file_system_raises(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes write(2) write up to the limit and then fail with EFBIG, as a
    full disk does with ENOSPC: the first call returns short, the second fails."""
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"t":1,"kind":"step","step":0}\n')
    limit = path.stat().st_size + 20  # room for part of the next record only
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    log = AppendLog(path)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
        with pytest.raises(OSError) as caught:
            log.append({"t": 2, "kind": "step", "step": 1, "pad": "x" * 100}, sync=True)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert caught.value.errno == errno.EFBIG
    assert any("of this append were written" in n for n in caught.value.__notes__)
    assert path.stat().st_size == limit  # the short write happened, and was not ignored
    log.append({"t": 3, "kind": "step", "step": 2}, sync=True)  # space again: repaired
    log.close()
    got = list(read_jsonl(path))
    tally("storage faults", tried=1)
    assert [e.get("step") for e in got if e["kind"] == "step"] == [0, 2]
    assert [e["kind"] for e in got] == ["step", "log_repaired", "step"]
