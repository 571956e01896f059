"""Workspace discovery, run records, run ids and the rebuildable index."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

import pytest

from acceptrun.errors import WorkspaceError
from acceptrun.record.workspace import Workspace, find_workspace, new_run_id


def test_run_ids_sort_by_time_and_read_well() -> None:
    a = new_run_id("BERT large / SQuAD", t=1_800_000_000)
    b = new_run_id("bert", t=1_800_000_001)
    assert re.fullmatch(r"20270115-080000-bert-large-squad-[0-9a-f]{4}", a)
    assert a < b


def test_find_workspace_walks_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCEPTRUN_WORKSPACE", raising=False)
    ws = Workspace.create(tmp_path / ".acceptrun")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_workspace(start=deep).root == ws.root


def test_find_workspace_prefers_flag_then_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Workspace.create(tmp_path / "one" / ".acceptrun")
    Workspace.create(tmp_path / "two" / ".acceptrun")
    monkeypatch.setenv("ACCEPTRUN_WORKSPACE", str(tmp_path / "two"))
    assert find_workspace(start=tmp_path).root == (tmp_path / "two" / ".acceptrun").resolve()
    assert (
        find_workspace(tmp_path / "one", start=tmp_path).root
        == (tmp_path / "one" / ".acceptrun").resolve()
    )


def test_no_workspace_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCEPTRUN_WORKSPACE", raising=False)
    with pytest.raises(
        WorkspaceError, match=r"no \.acceptrun/ workspace in .* run `acceptrun run SPEC`"
    ):
        find_workspace(start=tmp_path)
    monkeypatch.setenv("ACCEPTRUN_WORKSPACE", str(tmp_path / "missing"))
    with pytest.raises(
        WorkspaceError, match=r"\$ACCEPTRUN_WORKSPACE is .*missing'.* not a directory"
    ):
        find_workspace(start=tmp_path)
    created = find_workspace(start=tmp_path, create=True)
    assert created.root == (tmp_path / "missing").resolve()


def test_create_run_is_whole_and_indexed(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    rec = ws.create_run("job", spec_text='name = "job"\n', state={"mode": "supervised"})
    assert rec.spec_path.read_text() == 'name = "job"\n'
    assert rec.state["status"] == "created"
    assert rec.state["created_by"].count("@") == 1
    assert [p.name for p in ws.runs_dir.iterdir()] == [rec.run_id]  # no temporary left
    rec.event("step", step=1, loss=0.5)
    assert [e["step"] for e in rec.events("step")] == [1]
    rec.update_state(status="finished", verdict="accepted", duration_s=3.5)
    (row,) = ws.list_runs()
    assert (row.run_id, row.status, row.verdict) == (rec.run_id, "finished", "accepted")


def test_create_run_failure_leaves_nothing(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    with pytest.raises(TypeError):
        ws.create_run("job", spec_text='name = "job"\n', state={"bad": object()})
    assert list(ws.runs_dir.iterdir()) == []


def test_index_rebuild_recreates_from_run_dirs(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    ids = [ws.create_run(f"job{i}", spec_text="", state={}).run_id for i in range(3)]
    (ws.runs_dir / ids[1] / "run.json").write_text("{damaged")
    os.unlink(ws.index_path)
    count, skipped = ws.rebuild_index()
    assert count == 2
    assert skipped == [str(ws.runs_dir / ids[1])]
    assert [r.run_id for r in ws.list_runs()] == [ids[0], ids[2]]
    with sqlite3.connect(ws.index_path) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (2,)


def test_get_run_by_prefix_suffix_and_latest(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    a = ws.create_run("alpha", spec_text="", state={}, run_id="20261101-000000-alpha-aaaa")
    b = ws.create_run("beta", spec_text="", state={}, run_id="20261102-000000-beta-bbbb")
    assert ws.get_run("latest").run_id == b.run_id
    assert ws.get_run("20261101").run_id == a.run_id
    assert ws.get_run("bbbb").run_id == b.run_id
    with pytest.raises(WorkspaceError, match="ambiguous"):
        ws.get_run("2026110")
    with pytest.raises(WorkspaceError, match=r"no run 'zzz'.*acceptrun ls"):
        ws.get_run("zzz")
