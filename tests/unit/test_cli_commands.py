"""Each command line builds only its own group's parser, and parses as the whole parser does."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path
from typing import Any

import pytest

from acceptrun.cli.main import (
    COMMAND_MODULES,
    COMMANDS,
    GROUPS,
    OLD_NAME,
    RENAMED,
    build_parser,
    command_in,
    main,
)


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


def test_every_command_is_under_one_heading_of_the_help_or_is_an_old_name() -> None:
    headed = [name for names in GROUPS.values() for name in names]
    assert len(headed) == len(set(headed))
    assert sorted(headed + list(RENAMED)) == sorted(COMMANDS)
    assert not set(headed) & set(RENAMED)


def root_help(columns: int, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    return build_parser().format_help()


@pytest.mark.parametrize("columns", [60, 80, 100, 250])
def test_the_grouped_help_fits_100_columns(columns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = root_help(columns, monkeypatch).splitlines()
    assert max(map(len, lines)) <= min(columns, 100)
    assert [line[:-1] for line in lines if line[:1].isalpha() and line.endswith(":")][
        : len(GROUPS)
    ] == list(GROUPS)


def test_the_grouped_help_lists_each_command_on_one_line_and_no_old_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = root_help(80, monkeypatch).splitlines()
    for heading, names in GROUPS.items():
        start = lines.index(f"{heading}:") + 1
        listed = lines[start : start + len(names)]
        assert [line.split()[0] for line in listed] == list(names)
        assert all(len(line.split(maxsplit=1)) == 2 for line in listed)  # a description each
        assert start + len(names) == len(lines) or lines[start + len(names)] == ""  # no wrap
    words = {line.split()[0] for line in lines if line.startswith("  ") and line.split()}
    assert not words & set(RENAMED)


# Each old name: the new form's arguments and defaults, the same command, one note.
OLD_AND_NEW = [
    (["plan", "--gpus", "8", "--save", "30s", "--json"],
     ["ckpt", "plan", "--gpus", "8", "--save", "30s", "--json"]),
    (["scaling", "spec.toml", "--processes", "1,2,4", "--steps", "5", "-v"],
     ["bench", "scaling", "spec.toml", "--processes", "1,2,4", "--steps", "5", "-v"]),
]  # fmt: skip


@pytest.mark.parametrize(("old", "new"), OLD_AND_NEW, ids=lambda a: a[0])
def test_an_old_name_reads_its_line_as_the_new_form_does(
    old: list[str], new: list[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.toml").write_text('name = "x"\ncommand = "python train.py"\n')
    assert command_in(old) == old[0] and RENAMED[old[0]] == " ".join(new[:2])
    was = namespace(build_parser(old[0]), old)
    now = namespace(build_parser(new[0]), new)
    assert was.pop("renamed") == RENAMED[old[0]]
    assert (was.pop("command"), now.pop("command")) == (old[0], new[0])
    now = {k: v for k, v in now.items() if not k.endswith("_command")}  # ckpt_command ...
    assert was == now
    (sub,) = [a for a in build_parser(old[0])._actions if isinstance(a, argparse._SubParsersAction)]
    assert " ".join((OLD_NAME % RENAMED[old[0]]).split()) in " ".join(
        sub.choices[old[0]].format_help().split()
    )  # its own --help says it first: argparse answers --help before the note


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (["plan", "--save", "30s"], ["ckpt", "plan", "--save", "30s"]),  # UserError: 2
        (["plan", "--gpus", "0"], ["ckpt", "plan", "--gpus", "0"]),  # argparse: 2
        (
            ["plan", "--gpus", "8", "--save", "30s", "--restart", "5m", "--work", "3d", "--json"],
            [
                "ckpt",
                "plan",
                "--gpus",
                "8",
                "--save",
                "30s",
                "--restart",
                "5m",
                "--work",
                "3d",
                "--json",
            ],
        ),  # 0
        (
            ["scaling", "spec.toml", "--processes", "two"],
            ["bench", "scaling", "spec.toml", "--processes", "two"],
        ),  # UserError: 2
        (["scaling", "missing.toml"], ["bench", "scaling", "missing.toml"]),  # argparse: 2
    ],
    ids=lambda a: " ".join(a),
)
def test_an_old_name_exits_as_the_new_form_and_names_it_on_stderr(
    old: list[str], new: list[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.toml").write_text('name = "x"\ncommand = "python train.py"\n')

    def run(argv: list[str]) -> tuple[int, str, str]:
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own refusal
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    (was, was_out, was_err), (now, now_out, now_err) = run(old), run(new)
    assert was == now
    assert was_out == now_out
    note = f"note: `acceptrun {old[0]}` is now `acceptrun {RENAMED[old[0]]}`"
    assert "note:" not in now_err
    if was_err.startswith("usage:"):  # argparse refused it before the command ran
        assert note not in was_err
    else:
        assert was_err.splitlines()[0].startswith(note) and was_err.count("\n") >= 1
        assert was_err.split("\n", 1)[1] == now_err  # the rest word for word


def test_the_command_list_in_the_docs_has_every_heading_command_and_old_name() -> None:
    text = (Path(__file__).parents[2] / "docs" / "commands.md").read_text()
    block = text.split("```\n", 2)[1]
    for heading, names in GROUPS.items():
        assert f"\n{heading}\n" in f"\n{block}"
        section = block.split(f"{heading}\n", 1)[1].split("\n\n", 1)[0]
        for name in names:
            assert re.search(rf"(acceptrun |\||/ ){name}\b", section), (heading, name)
    for old, new in RENAMED.items():
        assert f"| `acceptrun {old}` | `acceptrun {new}` |" in text
