"""The one way a reader opens a file (acceptrun._util.confined.open_regular), on real files.

Each kind of entry that is not a regular file (a FIFO, a directory, a device behind a
link, a symlink out of the record, a symlink that stays inside it, a folder of the record
made a link) is refused at once, without blocking, naming the file and what it is, never
the link's target; a regular file, reached without a link, is read. The durable readers
built on it (read_json, read_jsonl, read_bytes_bounded) and RunRecord's readers refuse
the same entries, and a damaged events line is still only skipped.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.campaign import tally

from acceptrun._util.confined import open_regular
from acceptrun._util.durable import read_bytes_bounded, read_json, read_jsonl
from acceptrun.errors import RecordError, UnsafeFileError
from acceptrun.record.view import RecordView
from acceptrun.record.workspace import RunRecord, Workspace

SECRET = "planted-outside-0f3c9"


@pytest.fixture
def record(tmp_path: Path) -> Path:
    """A record folder with one good file, beside a folder outside holding a secret."""
    outside = tmp_path / "outside"
    (outside / "1").mkdir(parents=True)
    for name in ("secret.json", "1/stderr.log"):
        (outside / name).write_text(f'{{"kind": "step", "v": "{SECRET}"}}\n')
    run = tmp_path / "run"
    (run / "attempts").mkdir(parents=True)
    (run / "run.json").write_text('{"status": "finished"}')
    return run


def _plant(run: Path, name: str, kind: str) -> Path:
    path = run / name
    outside = run.parent / "outside"
    path.parent.mkdir(parents=True, exist_ok=True)
    make: dict[str, Callable[[], None]] = {
        "a FIFO": lambda: os.mkfifo(path),
        "a directory": lambda: path.mkdir(),
        "a link to /dev/zero": lambda: path.symlink_to("/dev/zero"),
        "a link out": lambda: path.symlink_to(outside / "secret.json"),
        "a link inside": lambda: path.symlink_to(run / "run.json"),
        "a dangling link": lambda: path.symlink_to(outside / "gone"),
    }
    make[kind]()
    return path


KINDS = ["a FIFO", "a directory", "a link to /dev/zero", "a link out", "a link inside",
         "a dangling link"]  # fmt: skip
EXPECTED = {"a FIFO": "a FIFO (named pipe)", "a directory": "a directory"}


@pytest.mark.parametrize("kind", KINDS)
def test_what_is_not_a_regular_file_of_the_record_is_refused_unread(
    record: Path, kind: str
) -> None:
    path = _plant(record, "verdict.json", kind)
    with pytest.raises(UnsafeFileError) as caught:
        open_regular(path, root=record)
    exc = caught.value
    assert isinstance(exc, RecordError) and isinstance(exc, OSError)
    assert exc.what == EXPECTED.get(kind, "a symbolic link"), exc.what
    assert str(path) in str(exc) and "outside" not in str(exc) and "/dev/zero" not in str(exc)
    # Every reader built on it says the same, and never blocks on the FIFO.
    with pytest.raises(UnsafeFileError):
        read_json(path, root=record)
    with pytest.raises(UnsafeFileError):
        read_bytes_bounded(path, root=record)
    damaged: list[str] = []
    assert list(read_jsonl(path, root=record, damaged=damaged)) == []
    assert damaged == [f"verdict.json: {exc.what}, neither followed nor read"]
    with pytest.raises(UnsafeFileError):
        RunRecord(record).read_json("verdict.json")
    tally("files a command reads", tried=1, tracebacks=0, hangs=0, secrets=0)


def test_a_folder_of_the_record_made_a_link_is_not_followed(record: Path) -> None:
    (record / "attempts").rmdir()
    (record / "attempts").symlink_to(record.parent / "outside")
    path = record / "attempts" / "1" / "stderr.log"
    with pytest.raises(UnsafeFileError, match="attempts is a symbolic link"):
        open_regular(path, root=record)
    with open_regular(path) as f:  # without a root, links are followed (a user's spec)
        assert SECRET in f.read().decode()
    tally("files a command reads", tried=1)


def test_a_path_that_leads_out_of_its_root_is_refused(record: Path) -> None:
    for path in (record / ".." / "outside" / "secret.json", record.parent / "outside" / "x"):
        with pytest.raises(UnsafeFileError, match="not a file inside"):
            open_regular(path, root=record)
    tally("files a command reads", tried=2)


def test_without_a_root_a_fifo_or_a_device_is_still_refused(record: Path) -> None:
    fifo = _plant(record, "events.jsonl", "a FIFO")
    with pytest.raises(UnsafeFileError, match="FIFO"):
        open_regular(fifo)
    with pytest.raises(UnsafeFileError, match="character device"):
        open_regular("/dev/zero")
    tally("files a command reads", tried=2)


def test_a_regular_file_reached_without_a_link_is_read(record: Path) -> None:
    (record / "attempts" / "1").mkdir()
    (record / "attempts" / "1" / "exit.json").write_text('{"code": 0}')
    assert read_json(record / "attempts" / "1" / "exit.json", root=record) == {"code": 0}
    assert RunRecord(record).read_json("run.json") == {"status": "finished"}
    assert RunRecord(record).read_json("missing.json", default=7) == 7
    with pytest.raises(FileNotFoundError):
        open_regular(record / "missing.json", root=record)


def test_events_that_are_a_link_are_a_problem_line_not_events(record: Path) -> None:
    _plant(record, "events.jsonl", "a link out")
    view = RecordView(record)
    assert view.log_events == []
    assert "events.jsonl: a symbolic link, neither followed nor read" in view.event_problems()
    tally("files a command reads", tried=1)


def test_a_link_in_runs_is_no_run(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    real = ws.create_run("job", spec_text="", state={})
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(real.path, elsewhere)
    link = ws.runs_dir / "20991231-000000-evil-0000"
    link.symlink_to(elsewhere, target_is_directory=True)
    assert ws.run_ids() == [real.run_id]
    assert ws.linked_runs() == [link]
    with pytest.raises(RecordError, match="is a symbolic link, not a run record"):
        ws.get_run(link.name)
    tally("files a command reads", tried=1)
