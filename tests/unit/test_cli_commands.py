"""Each command line builds only its own group's parser, and parses as the whole parser does."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

import pytest

from acceptrun.cli.main import COMMAND_MODULES, COMMANDS, build_parser, command_in, main


def registered_by(module: str) -> list[str]:
    parser = argparse.ArgumentParser()
    importlib.import_module(module).register(parser.add_subparsers())
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(action.choices)


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_the_table_names_every_command_of_each_module_and_no_other(module: str) -> None:
    assert sorted(registered_by(module)) == sorted(n for n, m in COMMANDS.items() if m == module)


def test_the_whole_parser_lists_the_commands_in_the_table_s_order() -> None:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    listed = list(action.choices)
    assert sorted(listed) == sorted(COMMANDS)
    # Modules register in COMMAND_MODULES order: each group is listed together, in that order.
    assert [COMMANDS[n] for n in listed] == sorted(
        (COMMANDS[n] for n in listed), key=COMMAND_MODULES.index
    )


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["run", "spec.toml"], "run"),
        (["--workspace", "ws", "ls"], "ls"),
        (["--workspace", "ls", "show", "RUN"], "show"),  # the workspace's value is not the command
        (["--workspace=ws", "--debug", "cost"], "cost"),
        (["run", "--help"], "run"),  # a command's own help needs its group only
        ([], None),
        (["--help"], None),
        (["-h", "run"], None),  # the root's help lists every command
        (["--version"], None),
        (["rnu", "spec.toml"], None),  # a mistyped command: argparse lists the choices
        (["--work", "ws", "ls"], None),  # an abbreviated root option: the whole parser reads it
        (["--workspace"], None),
    ],
)
def test_command_in(argv: list[str], command: str | None) -> None:
    assert command_in(argv) == command


COMMAND_LINES = [
    ["--workspace", "ws", "run", "-q", "spec.toml"],
    ["--debug", "resume", "RUN"],
    ["ls", "--all", "-n", "3"],
    ["show", "RUN"],
    ["cost", "show", "RUN"],
    ["submit", "spec.toml"],
    ["top", "--once"],
    ["export", "kubernetes", "spec.toml", "--out", "k8s"],
]


def namespace(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any]:
    return vars(parser.parse_args(argv))


@pytest.mark.parametrize("argv", COMMAND_LINES, ids=lambda a: " ".join(a))
def test_a_command_s_own_parser_reads_its_line_as_the_whole_parser_does(argv: list[str]) -> None:
    command = command_in(argv)
    assert command is not None
    assert namespace(build_parser(command), argv) == namespace(build_parser(), argv)


def test_a_mistyped_command_still_lists_every_choice(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["rnu", "spec.toml"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'rnu'" in err and "'run'" in err and "'ui'" in err
