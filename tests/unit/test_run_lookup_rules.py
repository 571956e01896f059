"""The run lookup's rules (record/lookup.py) on real workspaces and records, in-process:
the current workspace first, then the user's other listed workspaces; an exact id beats a
prefix; an id in two is an error listing both paths; a miss names what was searched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from acceptrun.errors import RecordError, WorkspaceError
from acceptrun.record import registry
from acceptrun.record.lookup import find_run
from acceptrun.record.workspace import Workspace

SPEC = 'name = "t"\ncommand = ["true"]\n'


@pytest.fixture
def folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Workspace]:
    """Workspaces a, b, c side by side, all listed; the current directory is a's."""
    monkeypatch.setenv(registry.ENV_CONFIG_DIR, str(tmp_path / "config"))
    made = {}
    for name in ("a", "b", "c"):
        ws = Workspace.create(tmp_path / name / ".acceptrun")
        registry.remember(ws.root)
        made[name] = ws
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    return made


def run(ws: Workspace, run_id: str) -> str:
    state = {"mode": "supervised", "status": "finished", "verdict": "accepted"}
    ws.create_run("t", spec_text=SPEC, state=state, run_id=run_id)
    return run_id


def test_the_current_workspace_first_then_the_listed_ones(folders: dict[str, Workspace]) -> None:
    a, b = folders["a"], folders["b"]
    run(a, "20261204-010101-t-aaaa")
    run(b, "20261204-020202-t-bbbb")
    here = find_run("20261204-010101-t-aaaa")
    assert (here.where, here.workspace.root) == ("here", a.root)
    there = find_run("20261204-020202-t-bbbb")
    assert (there.where, there.record.path) == ("listed", b.runs_dir / "20261204-020202-t-bbbb")
    assert find_run("20261204-0202").record.run_id == "20261204-020202-t-bbbb"  # a prefix
    assert find_run("t-bbbb").record.run_id == "20261204-020202-t-bbbb"  # a name suffix
    assert find_run("latest").record.run_id == "20261204-010101-t-aaaa"  # here's newest


def test_an_id_here_wins_over_the_same_id_elsewhere(folders: dict[str, Workspace]) -> None:
    for name in ("a", "b"):
        run(folders[name], "20261204-030303-t-same")
    assert find_run("20261204-030303-t-same").workspace.root == folders["a"].root


def test_an_id_in_two_other_workspaces_lists_both(folders: dict[str, Workspace]) -> None:
    for name in ("b", "c"):
        run(folders[name], "20261204-040404-t-twin")
    with pytest.raises(WorkspaceError, match="is in more than one of your workspaces") as info:
        find_run("20261204-040404-t-twin")
    for name in ("b", "c"):
        assert str(folders[name].runs_dir / "20261204-040404-t-twin") in str(info.value)
    picked = find_run(str(folders["c"].runs_dir / "20261204-040404-t-twin"))
    assert (picked.where, picked.workspace.root) == ("path", folders["c"].root)


def test_an_exact_id_beats_a_prefix_of_another(folders: dict[str, Workspace]) -> None:
    run(folders["b"], "20261204-050505-t-ab")
    run(folders["c"], "20261204-050505-t-abcd")  # begins with b's whole id
    assert find_run("20261204-050505-t-ab").workspace.root == folders["b"].root
    with pytest.raises(WorkspaceError, match="more than one"):
        find_run("20261204-0505")


def test_a_miss_names_every_workspace_searched_and_the_fix(folders: dict[str, Workspace]) -> None:
    run(folders["a"], "20261204-060606-t-here")
    with pytest.raises(WorkspaceError) as info:
        find_run("nosuch")
    message = str(info.value)
    assert message.startswith("no run 'nosuch' in 3 workspace(s)")
    for ws in folders.values():
        assert str(ws.root) in message
    assert "recent runs here: 20261204-060606-t-here" in message
    assert "`acceptrun ls --all`" in message and "<workspace>/runs/<id>" in message


def test_from_a_folder_with_no_workspace(
    folders: dict[str, Workspace], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(folders["b"], "20261204-070707-t-far")
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert find_run("20261204-070707-t-far").workspace.root == folders["b"].root
    with pytest.raises(WorkspaceError, match="newest run of the current workspace"):
        find_run("latest")
    with pytest.raises(WorkspaceError, match="there is no workspace in"):
        find_run("nosuch")


def test_a_named_workspace_is_searched_alone(folders: dict[str, Workspace]) -> None:
    run(folders["b"], "20261204-080808-t-far")
    with pytest.raises(WorkspaceError, match="--workspace names the workspace, so only it"):
        find_run("20261204-080808-t-far", workspace=folders["a"].root)
    found = find_run("20261204-080808-t-far", workspace=folders["b"].root)
    assert found.where == "here"


def test_a_damaged_record_here_is_said_not_searched_past(folders: dict[str, Workspace]) -> None:
    run(folders["b"], "20261204-090909-t-dmg")
    (folders["a"].runs_dir / "20261204-090909-t-dmg").mkdir()  # a record that lost run.json
    with pytest.raises(RecordError, match=r"run\.json is missing"):
        find_run("20261204-090909-t-dmg")


def test_workspaces_of_other_users_are_not_searched(folders: dict[str, Workspace]) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a workspace to another user needs root (the CI runs as root)")
    run(folders["b"], "20261204-101010-t-theirs")
    os.chown(folders["b"].root, 65534, 65534)  # nobody's now
    with pytest.raises(WorkspaceError, match=r"1 workspace\(s\) of other users left out"):
        find_run("20261204-101010-t-theirs")
