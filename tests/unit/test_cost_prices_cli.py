"""``acceptrun cost prices`` lists the catalog; ``acceptrun prices``, its old name, prints
the same and a note naming the new form."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from acceptrun.cli.main import OLD_NAME, RENAMED, build_parser, command_in, main
from acceptrun.record.workspace import Workspace


def test_the_old_name_prints_what_the_new_form_prints_and_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    assert main(["--workspace", str(ws.root), "cost", "prices"]) == 0
    new = capsys.readouterr()
    assert main(["--workspace", str(ws.root), "prices"]) == 0
    old = capsys.readouterr()
    assert old.out == new.out and "lambda" in new.out and "USD/h" in new.out
    assert new.err == ""
    assert "`acceptrun prices` is now `acceptrun cost prices`" in old.err


def test_the_old_name_is_listed_as_renamed_and_its_help_says_so() -> None:
    assert command_in(["prices"]) == "prices" and RENAMED["prices"] == "cost prices"
    parser = build_parser("prices")
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert " ".join((OLD_NAME % "cost prices").split()) in " ".join(
        sub.choices["prices"].format_help().split()
    )
    cost = sub.choices["cost"]
    (actions,) = [a for a in cost._actions if isinstance(a, argparse._SubParsersAction)]
    assert "prices" in actions.choices
