"""A record's frozen spec is parsed once per process and read from there by every view."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from acceptrun.errors import SpecError
from acceptrun.record.workspace import Workspace


def test_the_frozen_spec_is_parsed_once_while_unchanged(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / "ws")
    record = ws.create_run("a", spec_text='name = "a"\ncommand = ["true"]\n', state={})
    first = record.spec
    assert first.name == "a"
    assert record.spec is first  # the same parse, from another reader of the same record
    assert ws.get_run(record.run_id).spec is first
    record.spec_path.write_text('name = "b"\ncommand = ["true"]\n')
    os.utime(record.spec_path, ns=(1, 1))  # a change within the clock's resolution too
    assert record.spec.name == "b"


def test_a_missing_spec_names_the_file(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / "ws")
    record = ws.create_run("a", spec_text='name = "a"\ncommand = ["true"]\n', state={})
    record.spec_path.unlink()
    with pytest.raises(SpecError, match=r"spec\.toml"):
        record.spec  # noqa: B018 - read for the error
