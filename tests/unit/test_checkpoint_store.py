"""Checkpoint store: commit protocol, verification, quarantine, retention, redating (under
crashes: tests/integration/test_checkpoint_store_crashes.py)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from acceptrun._util.hashing import hash_file
from acceptrun.checkpoint.sequence import COMMITS
from acceptrun.checkpoint.store import (
    LATEST,
    MANIFEST,
    QUARANTINE,
    CheckpointStore,
)
from acceptrun.errors import RecordError, UserError
from builders import Events, commit_step, entries


def steps(store: CheckpointStore) -> list[int]:
    return [i.step for i in store.list()]


def test_commit_round_trip(tmp_path: Path) -> None:
    events = Events()
    store = CheckpointStore(tmp_path / "ckpt", on_event=events)
    writer = store.begin(10)
    assert writer.path.name.startswith(".staging-step-10-")
    with writer.open("model/layers/weights.bin") as f:
        for i in range(5):  # several writes, some larger than the buffer
            f.write(bytes([i]) * (300_000 * (i + 1)))
    writer.write_bytes("optimizer.bin", b"\x00\x01" * 1000)
    writer.write_json("trainer/state.json", {"step": 10, "lr": 0.1})
    info = store.commit(writer, metrics={"loss": 1.5}, meta={"spec": "s.toml"})

    root = tmp_path / "ckpt"
    assert entries(root) == [COMMITS, LATEST, "step-10"]  # no staging left behind
    assert (root / LATEST).read_text() == "step-10\n"
    manifest = json.loads((root / "step-10" / MANIFEST).read_text())
    assert manifest["kind"] == "acceptrun.checkpoint"
    assert manifest["schema"] == 1
    assert manifest["step"] == 10
    assert manifest["algorithm"] == "xxh3_128"
    assert manifest["metrics"] == {"loss": 1.5}
    assert manifest["meta"] == {"spec": "s.toml"}
    assert manifest["created_at"].endswith("Z")
    names = ["model/layers/weights.bin", "optimizer.bin", "trainer/state.json"]
    assert sorted(manifest["files"]) == names
    for name in names:  # hashed while writing == hashed from disk
        digest, size = hash_file(root / "step-10" / name)
        assert manifest["files"][name] == {"size": size, "hash": digest}
    assert manifest["total_bytes"] == sum(f["size"] for f in manifest["files"].values())
    assert info.files == manifest["files"]
    assert info.path == root / "step-10"
    assert info.metrics == {"loss": 1.5}
    assert store.get(10) == info
    assert store.latest() == info
    assert store.list() == [info]
    assert store.get(11) is None
    commit = events.of("checkpoint_commit")
    assert [c["step"] for c in commit] == [10]
    assert commit[0]["total_bytes"] == info.total_bytes
    assert commit[0]["seconds"] >= 0
    result = store.verify()
    assert result.ok and result.step == 10 and result.problems == []
    assert result.checked_bytes == info.total_bytes


def test_list_is_numeric_and_skips_what_is_not_a_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=10)
    for step in (100, 9, 10):
        commit_step(store, step)
    (tmp_path / "step-7").mkdir()  # no manifest: never committed
    (tmp_path / "step-08").mkdir()  # not a plain step number
    (tmp_path / "notes.txt").write_text("hi")
    assert steps(store) == [9, 10, 100]
    assert store.latest() is not None and store.latest().step == 10  # LATEST, not the max


def test_writer_rejects_bad_names_and_seeks(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    writer = store.begin(1)
    for bad in ["../escape", "/abs", "a/../b", "a//b", "", MANIFEST]:
        with pytest.raises(UserError, match="is not allowed"):
            writer.write_bytes(bad, b"x")
    writer.write_bytes("a.bin", b"x")
    with pytest.raises(UserError, match="already written"):
        writer.write_bytes("a.bin", b"y")
    with pytest.raises(OSError, match="not seekable"), writer.open("b.bin") as f:
        f.write(b"abc")
        f.seek(0)
    # the failed block abandoned the whole save
    assert writer.state == "aborted"
    assert not writer.path.exists()
    with pytest.raises(UserError, match="already aborted"):
        store.commit(writer)
    with pytest.raises(UserError, match="integer >= 0"):
        store.begin(-1)


def test_commit_refuses_unhashed_files_and_bad_metrics(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    writer = store.begin(3)
    writer.write_bytes("ok.bin", b"ok")
    (writer.path / "sneaky.bin").write_bytes(b"written around the writer")
    with pytest.raises(UserError, match=r"sneaky\.bin.*without writer\.open"):
        store.commit(writer)
    (writer.path / "sneaky.bin").unlink()
    with pytest.raises(UserError, match="Out of range float"):
        store.commit(writer, metrics={"loss": float("nan")})
    with pytest.raises(UserError, match="not JSON serializable"):
        store.commit(writer, meta={"obj": object()})
    assert store.commit(writer, metrics={"loss": 2.0}).step == 3  # still open after refusals


def test_abort_removes_staging(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    commit_step(store, 1)
    writer = store.begin(2)
    writer.write_bytes("model.bin", b"half")
    store.abort(writer)
    store.abort(writer)  # twice is harmless
    assert entries(tmp_path) == [COMMITS, LATEST, "step-1"]
    assert steps(store) == [1]


def corrupt_flip(d: Path) -> None:
    data = bytearray((d / "model.bin").read_bytes())
    data[len(data) // 2] ^= 0x01
    (d / "model.bin").write_bytes(bytes(data))


def corrupt_truncate(d: Path) -> None:
    data = (d / "model.bin").read_bytes()
    (d / "model.bin").write_bytes(data[:-7])


def corrupt_missing(d: Path) -> None:
    (d / "model.bin").unlink()


def corrupt_extra(d: Path) -> None:
    (d / "evil.pkl").write_bytes(pickle.dumps({"payload": 1}))


def corrupt_garbage_manifest(d: Path) -> None:
    (d / MANIFEST).write_bytes(b"\x00garbage{")


def corrupt_wrong_kind(d: Path) -> None:
    (d / MANIFEST).write_text(json.dumps({"kind": "something.else"}))


def corrupt_missing_keys(d: Path) -> None:
    doc = json.loads((d / MANIFEST).read_text())
    del doc["files"]
    (d / MANIFEST).write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("corrupt", "expected", "still_listed"),
    [
        pytest.param(corrupt_flip, "step-2/model.bin: wrong hash", True, id="flipped-byte"),
        pytest.param(corrupt_truncate, "step-2/model.bin: wrong size", True, id="truncated"),
        pytest.param(corrupt_missing, "step-2/model.bin: missing", True, id="missing-file"),
        pytest.param(corrupt_extra, "step-2/evil.pkl: unexpected file", True, id="planted-pickle"),
        pytest.param(
            corrupt_garbage_manifest, "MANIFEST.json: not valid JSON", False, id="garbage"
        ),
        pytest.param(corrupt_wrong_kind, "not a checkpoint manifest", False, id="wrong-kind"),
        pytest.param(corrupt_missing_keys, "missing keys ['files']", False, id="missing-keys"),
    ],
)
def test_verify_names_each_fault(
    tmp_path: Path, corrupt: Any, expected: str, still_listed: bool
) -> None:
    store = CheckpointStore(tmp_path)
    commit_step(store, 1)
    commit_step(store, 2, data=os.urandom(4096))
    corrupt(tmp_path / "step-2")
    result = store.verify(2)
    assert not result.ok
    assert result.step == 2
    assert any(expected in p for p in result.problems), result.problems
    assert store.verify().problems == result.problems  # step-2 is the LATEST target
    assert (2 in steps(store)) == still_listed
    with pytest.raises(RecordError, match="failed verification"):
        result.raise_for_problems()
    assert store.verify(1).ok


def test_missing_manifest_means_no_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    commit_step(store, 1)
    commit_step(store, 2)
    (tmp_path / "step-2" / MANIFEST).unlink()
    assert steps(store) == [1]
    latest = store.latest()
    assert latest is not None and latest.step == 1  # LATEST names step-2, which is not one
    result = store.verify(2)
    assert result.problems == [
        "step-2/MANIFEST.json: missing (the save never finished, or it was removed)"
    ]
    assert store.verify(99).problems == [f"step-99: no such checkpoint directory in {tmp_path}"]
    assert not CheckpointStore(tmp_path / "empty").verify().ok


def test_latest_verified_quarantines_and_falls_back(tmp_path: Path) -> None:
    events = Events()
    store = CheckpointStore(tmp_path, keep_last=3, on_event=events)
    for step in (1, 2, 3):
        commit_step(store, step)
    corrupt_flip(tmp_path / "step-3")
    corrupt_extra(tmp_path / "step-2")

    # Without quarantine: the answer, and nothing moves.
    info = store.latest_verified(quarantine=False)
    assert info is not None and info.step == 1
    assert steps(store) == [1, 2, 3]
    assert events.of("checkpoint_quarantine") == []

    info = store.latest_verified()
    assert info is not None and info.step == 1
    assert steps(store) == [1]
    assert (tmp_path / LATEST).read_text() == "step-1\n"
    moved = sorted((tmp_path / QUARANTINE).iterdir())
    assert [p.name.rsplit("-", 1)[0] for p in moved] == ["step-2", "step-3"]
    for path in moved:  # never deleted: the files are still there, with the reason
        assert (path / "model.bin").exists()
        reason = (path / "REASON.txt").read_text()
        assert reason.startswith("failed verification: ")
    assert "evil.pkl: unexpected file" in (moved[0] / "REASON.txt").read_text()
    assert (moved[0] / "evil.pkl").exists()
    quarantined = events.of("checkpoint_quarantine")
    assert [q["step"] for q in quarantined] == [3, 2]
    assert "wrong hash" in quarantined[0]["reason"]
    assert store.latest_verified() == info  # stable once clean


def test_latest_verified_defers_and_skips_what_its_caller_checks(tmp_path: Path) -> None:
    """A sharded load hashes the shard files itself (defer) and sets aside a step its
    ranks found bad without quarantining it (skip); a LATEST whose target the caller
    quarantined is repointed at the one that verifies."""
    store = CheckpointStore(tmp_path, keep_last=3)
    for step in (1, 2, 3):
        commit_step(store, step)
    corrupt_flip(tmp_path / "step-3")  # model.bin: the deferred file
    info = store.latest_verified(quarantine=False, defer=lambda name: name == "model.bin")
    assert info is not None and info.step == 3  # its size holds: the caller hashes it
    assert store.verify(3, defer=["model.bin"]).deferred == ("model.bin",)
    info = store.latest_verified(quarantine=False, defer=lambda n: n == "model.bin", skip={3})
    assert info is not None and info.step == 2
    assert steps(store) == [1, 2, 3]  # nothing moved
    store.quarantine(tmp_path / "step-3", "failed verification: model.bin: wrong hash")
    assert (tmp_path / LATEST).read_text() == "step-3\n"  # dangling now
    info = store.latest_verified(defer=lambda n: n == "model.bin")
    assert info is not None and info.step == 2
    assert (tmp_path / LATEST).read_text() == "step-2\n"


def test_commit_without_retention_leaves_the_pruning_to_the_caller(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=2)
    for step in (1, 2):
        commit_step(store, step)
    writer = store.begin(3)
    writer.write_bytes("model.bin", b"weights 3")
    store.commit(writer, retain=False)
    assert steps(store) == [1, 2, 3]  # committed, nothing pruned yet
    assert store.apply_retention() == [1]
    assert steps(store) == [2, 3]


def test_latest_verified_none_good(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.latest_verified() is None  # empty root
    commit_step(store, 1)
    commit_step(store, 2)
    corrupt_missing(tmp_path / "step-1")
    corrupt_garbage_manifest(tmp_path / "step-2")  # the LATEST target, unlisted
    assert store.latest_verified() is None
    assert not (tmp_path / LATEST).exists()
    assert entries(tmp_path) == [COMMITS, QUARANTINE]
    assert len(list((tmp_path / QUARANTINE).iterdir())) == 2


def test_resave_same_step_quarantines_the_older_copy(tmp_path: Path) -> None:
    events = Events()
    store = CheckpointStore(tmp_path, on_event=events)
    commit_step(store, 1)
    commit_step(store, 2, data=b"first attempt")
    info = commit_step(store, 2, data=b"second attempt")
    assert (info.path / "model.bin").read_bytes() == b"second attempt"
    assert store.verify(2).ok
    (old,) = (tmp_path / QUARANTINE).iterdir()
    assert old.name.startswith("step-2-")
    assert (old / "model.bin").read_bytes() == b"first attempt"
    assert (old / "REASON.txt").read_text().startswith("replaced by a new save of the same step")
    assert [q["reason"] for q in events.of("checkpoint_quarantine")] == [
        "replaced by a new save of the same step"
    ]
    assert steps(store) == [1, 2]
    assert (tmp_path / LATEST).read_text() == "step-2\n"


def test_redate_stores_the_same_files_under_the_step_now_known(tmp_path: Path) -> None:
    events = Events()
    store = CheckpointStore(tmp_path, keep_last=2, on_event=events)
    commit_step(store, 3)
    old = commit_step(store, 4, data=b"the state of step 20", loss=0.5)
    info = store.redate(4, 20, meta={"dated": {"by": "tensorboard"}})
    assert steps(store) == [3, 20]  # one checkpoint more never pushed one out
    assert (info.path / "model.bin").read_bytes() == b"the state of step 20"
    assert store.verify(20).ok
    assert (info.files, info.metrics, info.created_at) == (old.files, old.metrics, old.created_at)
    assert info.meta["dated"] == {"by": "tensorboard"}
    assert (tmp_path / LATEST).read_text() == "step-20\n"  # it named the old step
    (commit,) = [c for c in events.of("checkpoint_commit") if c.get("redated_from")]
    assert (commit["step"], commit["redated_from"]) == (20, 4)
    (gone,) = events.of("checkpoint_delete")
    assert (gone["step"], gone["redated_to"]) == (4, 20)
    assert entries(tmp_path) == [COMMITS, LATEST, "step-20", "step-3"]  # nothing left behind


def test_redate_leaves_latest_on_a_newer_save_and_refuses_a_taken_step(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=5)
    commit_step(store, 1)
    commit_step(store, 2)
    commit_step(store, 30)
    store.redate(2, 10, meta={})
    assert steps(store) == [1, 10, 30]
    assert (tmp_path / LATEST).read_text() == "step-30\n"
    with pytest.raises(UserError, match="step 30 is held by another checkpoint"):
        store.redate(10, 30, meta={})
    with pytest.raises(UserError, match="no committed checkpoint of step 7"):
        store.redate(7, 8, meta={})
    assert steps(store) == [1, 10, 30] and store.verify(10).ok


def test_redate_to_the_same_step_only_amends_the_meta(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    old = commit_step(store, 5)
    info = store.redate(5, 5, meta={"dated": {"by": "steps"}})
    assert info.path == old.path and info.files == old.files
    assert info.meta == {**old.meta, "dated": {"by": "steps"}}
    assert store.get(5) == info and store.verify(5).ok  # its digest covers the new meta


def test_retention_keep_last(tmp_path: Path) -> None:
    events = Events()
    store = CheckpointStore(tmp_path, keep_last=2, on_event=events)
    for step in range(1, 7):
        commit_step(store, step)
    assert steps(store) == [5, 6]
    deleted = events.of("checkpoint_delete")
    assert [d["step"] for d in deleted] == [1, 2, 3, 4]
    assert all("not among the newest 2" in d["reason"] for d in deleted)
    assert entries(tmp_path) == [COMMITS, LATEST, "step-5", "step-6"]  # no .deleting- leftovers


def test_retention_keep_every_and_best(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=2, keep_every=3)
    for step in range(1, 7):
        commit_step(store, step)
    assert steps(store) == [3, 5, 6]

    best = CheckpointStore(tmp_path / "best", keep_last=2, keep_best=("loss", "min"))
    losses = {1: 3.0, 2: 0.5, 3: 2.0, 4: 1.0, 5: 4.0, 6: 5.0}
    for step, loss in losses.items():
        commit_step(best, step, loss=loss)
    commit_step(best, 7)  # no loss: not a candidate, still kept as one of the newest
    assert steps(best) == [2, 6, 7]

    biggest = CheckpointStore(tmp_path / "max", keep_last=1, keep_best=("acc", "max"))
    for step, acc in {1: 0.1, 2: 0.9, 3: 0.5}.items():
        commit_step(biggest, step, acc=acc)
    assert steps(biggest) == [2, 3]


def test_retention_never_deletes_latest_target_or_newer(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=2)
    for step in range(1, 6):
        commit_step(store, step)
    (tmp_path / LATEST).write_text("step-4\n")
    store_1 = CheckpointStore(tmp_path, keep_last=1)
    assert store_1.apply_retention() == []  # 4 is the resume point, 5 is newer
    (tmp_path / LATEST).write_text("step-5\n")
    assert store_1.apply_retention() == [4]


def test_retention_ignores_an_uncommitted_newest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        commit_step(store, step)
    assert steps(store) == [2, 3]
    corrupt_garbage_manifest(tmp_path / "step-3")
    assert store.apply_retention() == []  # step-3 is not committed: 2 is the only good one
    assert steps(store) == [2]
    assert (tmp_path / "step-3").is_dir()  # not ours to delete either
    info = store.latest()
    assert info is not None and info.step == 2


def test_store_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointStore(tmp_path, keep_last=0)
    with pytest.raises(ValueError, match="keep_every"):
        CheckpointStore(tmp_path, keep_every=0)
    with pytest.raises(ValueError, match="keep_best"):
        CheckpointStore(tmp_path, keep_best=("loss", "lowest"))
    CheckpointStore(tmp_path, keep_last=1)  # allowed here, refused by the spec layer


def test_join_of_a_staging_dir_this_machine_cannot_see_names_the_shared_directory(
    tmp_path: Path,
) -> None:
    # A rank on another node whose checkpoint directory is a node-local disk: rank 0's
    # staging directory is not there. The error says why, not only that it is missing.
    store = CheckpointStore(tmp_path / "ckpt")
    elsewhere = store.root / f".staging-step-3-{os.getpid()}-0a1b2c3d"
    with pytest.raises(UserError, match=r"does not exist on this machine.*shared checkpoint"):
        store.join(3, elsewhere)
