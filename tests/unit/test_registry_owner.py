"""The user's list of workspaces is the user's own, on real files and real owners.

The rules (record/registry.py): the directory is created 0700; a directory or list owned
by another user or writable by anyone is refused, naming the path and the fix; a listed
workspace that belongs to another user is left out of ``owned()`` and counted. The CI runs
as root, so "another user" is made real both ways: as root a directory is chowned to
nobody (uid 65534), as anyone else a root-owned directory is used.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from acceptrun._util.paths import ownership_problem
from acceptrun.cli.main import build_parser
from acceptrun.record import registry
from conftest import run_taking_commands

NOBODY = 65534


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home" / ".config" / "acceptrun"
    monkeypatch.setenv(registry.ENV_CONFIG_DIR, str(path))
    monkeypatch.setattr(registry, "_warned", False)  # each test sees its own warning
    return path


def foreign_dir(tmp_path: Path) -> Path:
    """A directory that exists and is not the current user's own."""
    if os.geteuid() == 0:
        path = tmp_path / "theirs"
        path.mkdir()
        os.chown(path, NOBODY, NOBODY)
    else:
        path = Path("/")  # root's
    assert ownership_problem(path) is not None, f"{path} is the test user's own"
    return path


def workspace(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name / ".acceptrun"
    (path / "runs").mkdir(parents=True)
    return path


def test_the_directory_is_made_0700_whatever_the_umask(config: Path, tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        registry.remember(workspace(tmp_path, "a"))
    finally:
        os.umask(old)
    assert config.stat().st_mode & 0o777 == 0o700
    assert [e.project for e in registry.listed()] == ["a"]


def test_a_world_writable_directory_is_refused(config: Path, tmp_path: Path) -> None:
    registry.remember(workspace(tmp_path, "a"))
    config.chmod(0o777)
    with pytest.raises(registry.RegistryRefused) as info:
        registry.listed()
    message = str(info.value)
    assert str(config) in message and "writable by every user (mode 0777)" in message
    assert registry.ENV_CONFIG_DIR in message and "chmod 700" in message


def test_a_shared_directory_like_tmp_is_refused_and_never_told_to_close(
    config: Path, tmp_path: Path
) -> None:
    config.mkdir(parents=True)
    config.chmod(0o1777)  # what /tmp is
    with pytest.raises(registry.RegistryRefused) as info:
        registry.listed()
    assert "mode 1777" in str(info.value) and "chmod" not in str(info.value)
    assert f"set ${registry.ENV_CONFIG_DIR} to a directory of your own" in str(info.value)


def test_a_world_writable_list_is_refused(config: Path, tmp_path: Path) -> None:
    registry.remember(workspace(tmp_path, "a"))
    (config / registry.FILE).chmod(0o666)
    with pytest.raises(registry.RegistryRefused, match=r"workspaces\.json is writable by every"):
        registry.owned()


def test_a_list_of_another_user_is_refused(config: Path, tmp_path: Path) -> None:
    registry.remember(workspace(tmp_path, "a"))
    if os.geteuid() == 0:
        os.chown(config / registry.FILE, NOBODY, NOBODY)
        owner = NOBODY
    else:  # a directory of root's holds the list: it is not the user's either
        os.environ[registry.ENV_CONFIG_DIR] = "/"
        owner = 0
    with pytest.raises(registry.RegistryRefused, match=f"owned by uid {owner}, not by you"):
        registry.listed()


def test_remember_never_raises_on_a_refused_list_and_says_so(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry.remember(workspace(tmp_path, "a"))
    config.chmod(0o757)
    registry.remember(workspace(tmp_path, "b"))  # a run must not fail over the list
    err = capsys.readouterr().err
    assert "is writable by every user" in err and "will not show" in err
    config.chmod(0o700)
    assert [e.project for e in registry.listed()] == ["a"]  # b was not written into it


def test_workspaces_of_other_users_are_left_out_and_counted(config: Path, tmp_path: Path) -> None:
    mine = workspace(tmp_path, "mine")
    theirs = foreign_dir(tmp_path)
    registry.remember(mine)
    registry.remember(theirs)
    gone = workspace(tmp_path, "gone")
    registry.remember(gone)
    assert len(registry.listed()) == 3
    owned = registry.owned()
    assert sorted(e.path for e in owned.workspaces) == sorted([mine.resolve(), gone.resolve()])
    assert owned.others == 1
    assert owned.note() is not None and owned.note().startswith(
        "1 workspace of other users left out"
    )


def test_a_world_writable_workspace_of_the_user_s_is_still_the_user_s(
    config: Path, tmp_path: Path
) -> None:
    path = workspace(tmp_path, "shared")
    path.chmod(0o777)
    registry.remember(path)
    assert registry.owned().others == 0


def test_a_removed_workspace_is_not_counted_as_another_user_s(config: Path, tmp_path: Path) -> None:
    path = workspace(tmp_path, "gone")
    registry.remember(path)
    (path / "runs").rmdir()
    path.rmdir()
    owned = registry.owned()
    assert owned.others == 0 and [e.path for e in owned.workspaces] == [path.resolve()]
    assert owned.note() is None


# ---- the declaration of commands that take a run ---------------------------------------------


def _positionals(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], str, str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                out += _positionals(child, (*words, name))
        elif not action.option_strings and action.dest != "help":
            out.append((words, action.dest, action.help or "", parser))
    return out


def test_every_argument_that_names_a_run_is_declared_as_one() -> None:
    """A positional called run/run_a/..., or whose help says it takes a run id, is declared
    through add_run_argument: its command then finds runs as every other command does, and
    tests/integration/test_run_lookup.py runs it on a run of a sibling workspace."""
    missed = []
    for words, dest, text, parser in _positionals(build_parser()):
        if not (dest.startswith("run") or "run id" in text):
            continue
        declared = (*(parser.get_default("run_refs") or ()),
                    *(parser.get_default("run_refs_here") or ()))  # fmt: skip
        if dest not in declared:
            missed.append(f"acceptrun {' '.join(words)} {dest}")
    assert not missed, f"declare these with cli.record.add_run_argument: {missed}"


def test_the_declaration_lists_the_commands_that_take_a_run() -> None:
    anywhere = dict(run_taking_commands())
    here = dict(run_taking_commands("run_refs_here"))
    for words in [("show",), ("report",), ("resume",), ("stop",), ("kill",), ("ckpt", "ls"),
                  ("env", "diff"), ("reproduce",), ("cost", "show"), ("export", "mlflow")]:  # fmt: skip
        assert words in anywhere, words
    assert anywhere[("diff",)] == ("run_a", "run_b")
    assert here == {("cancel",): ("job",)}
    assert not set(anywhere) & set(here)
