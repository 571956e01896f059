"""checkpoint/owner.py: where a run's store is, who owns it, and refusals of another's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from acceptrun.checkpoint.owner import (
    LAYOUT_KEY,
    OWNER,
    PER_RUN,
    StoreOwnedError,
    StoreOwner,
    check_fresh,
    create_run_store,
    mirror_root,
    open_run_store,
    owner_of,
    read_owner,
    store_root,
)
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.spec.model import load_spec


def make_record(
    tmp_path: Path, *, ckpt_dir: str | None, layout: bool, name: str = "r"
) -> RunRecord:
    ws = Workspace(tmp_path / "ws")
    section = f"[checkpoint]\ndir = {json.dumps(ckpt_dir)}\n" if ckpt_dir else ""
    spec = f'name = "{name}"\ncommand = ["true"]\nworkdir = {json.dumps(str(tmp_path))}\n{section}'
    state = {"mode": "supervised", "status": "finished"} | ({LAYOUT_KEY: PER_RUN} if layout else {})
    return ws.create_run(name, spec_text=spec, state=state)


def commit(store_root_dir: Path, record: RunRecord, step: int) -> None:
    store = open_run_store(record, root=store_root_dir, claim=True)
    w = store.begin(step)
    w.write_bytes("w.bin", b"x" * 16)
    store.commit(w)


@pytest.mark.parametrize(
    ("ckpt_dir", "layout", "where"),
    [
        pytest.param(None, True, "record", id="default"),
        pytest.param("shared", True, "per-run", id="checkpoint.dir"),
        pytest.param("shared", False, "shared", id="older-record"),
    ],
)
def test_store_root(tmp_path: Path, ckpt_dir: str | None, layout: bool, where: str) -> None:
    record = make_record(tmp_path, ckpt_dir=str(tmp_path / ckpt_dir) if ckpt_dir else None,
                         layout=layout)  # fmt: skip
    expected = {
        "record": record.checkpoints_dir,
        "per-run": tmp_path / "shared" / record.run_id,
        "shared": tmp_path / "shared",
    }[where]
    assert store_root(record) == expected
    assert not expected.exists()  # resolving creates nothing


def test_a_new_store_records_its_owner_atomically(tmp_path: Path) -> None:
    record = make_record(tmp_path, ckpt_dir=str(tmp_path / "shared"), layout=True)
    path = create_run_store(record, load_spec(record.spec_path))
    doc = json.loads((path / OWNER).read_text())
    assert doc["kind"] == "acceptrun.checkpoint_store"
    assert (doc["run_id"], doc["spec"]) == (record.run_id, "r")
    assert doc["run_created_at"] == record.state["created_at"]
    assert sorted(p.name for p in path.iterdir()) == [OWNER]  # no temporary file left
    assert read_owner(path) == owner_of(record)


def test_another_runs_store_is_refused_naming_dir_owner_and_fix(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    first = make_record(tmp_path, ckpt_dir=str(shared), layout=False, name="a")
    second = make_record(tmp_path, ckpt_dir=str(shared), layout=False, name="b")
    commit(shared, first, 5)
    with pytest.raises(StoreOwnedError) as caught:
        open_run_store(second)
    message = str(caught.value)
    assert f"the checkpoint store {shared} belongs to run {first.run_id} (spec 'a'" in message
    assert f"not to run {second.run_id}" in message
    assert "resume that run instead" in message  # the fix
    with pytest.raises(StoreOwnedError):
        open_run_store(second, root=shared, claim=True)  # a claim never takes it over
    assert read_owner(shared).run_id == first.run_id  # type: ignore[union-attr]
    assert [i.step for i in open_run_store(first).list()] == [5]


def test_an_older_unowned_store_is_claimed_by_its_run_on_first_write(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    record = make_record(tmp_path, ckpt_dir=str(shared), layout=False)
    assert open_run_store(record).list() == [] and not shared.exists()  # reads create nothing
    commit(shared, record, 1)
    assert read_owner(shared) == owner_of(record)


def test_same_run_id_from_another_record_is_another_run() -> None:
    a = StoreOwner("train", "s", "2026-01-01T00:00:00.000Z")
    assert a.same_run(StoreOwner("train", "other-name", "2026-01-01T00:00:00.000Z"))
    assert a.same_run(StoreOwner("train", "s", None))  # an older owner file: unknown time
    assert not a.same_run(StoreOwner("train", "s", "2026-05-05T00:00:00.000Z"))
    assert not a.same_run(StoreOwner("other", "s", a.run_created_at))


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"{not json", id="not-json"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, id="deep"),
        pytest.param(json.dumps({"kind": "x", "run_id": "a"}).encode(), id="wrong-kind"),
        pytest.param(json.dumps({"kind": "acceptrun.checkpoint_store"}).encode(), id="no-run"),
        pytest.param(b"\xff\xfe", id="not-utf8"),
    ],
)
def test_a_damaged_owner_file_is_refused_not_a_traceback(tmp_path: Path, content: bytes) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / OWNER).write_bytes(content)
    record = make_record(tmp_path, ckpt_dir=str(shared), layout=False)
    with pytest.raises(StoreOwnedError, match=r"does not say which run owns"):
        open_run_store(record)
    assert (shared / OWNER).read_bytes() == content  # left for a person to decide


def test_a_fresh_store_that_is_not_empty_is_refused(tmp_path: Path) -> None:
    taken = tmp_path / "shared" / "train"
    taken.mkdir(parents=True)
    (taken / "step-3").mkdir()
    with pytest.raises(StoreOwnedError, match=r"is not empty.*choose another --run-id"):
        check_fresh(taken, "train")
    check_fresh(tmp_path / "shared" / "new", "new")  # absent: fine
    (tmp_path / "empty").mkdir()
    check_fresh(tmp_path / "empty", "empty")


def test_mirror_root_is_per_run(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    spec = f'name = "m"\ncommand = ["true"]\nworkdir = {json.dumps(str(tmp_path))}\n'
    record = ws.create_run("m", spec_text=spec, state={})
    assert mirror_root(record, load_spec(record.spec_path)) is None
    for base, expected in (
        ("s3://bucket/ckpt/", f"s3://bucket/ckpt/{record.run_id}"),
        ("mirror", f"{tmp_path}/mirror/{record.run_id}"),
    ):
        record.spec_path.write_text(spec + f"[checkpoint]\nmirror = {json.dumps(base)}\n")
        assert mirror_root(record, load_spec(record.spec_path)) == expected
