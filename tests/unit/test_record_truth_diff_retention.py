"""The record tells the truth, in-process: what diff claims (reproduced, bitwise, compared),
mirror retention that keeps the newest verified step, a workspace that never ignores its
project (real processes: tests/integration/test_record_truth.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.verdict.diff import diff_runs, format_run_diff
from builders import make_checkpoint

# ---- 1. diff says what it compared ---------------------------------------------------------


def _record(
    ws: Workspace, name: str, events: list[dict[str, Any]], data_root: str | None
) -> RunRecord:
    record = ws.create_run(name, spec_text=f'name = "{name}"\ncommand = ["true"]\n', state={})
    for ev in events:
        fields = dict(ev)
        record.event(fields.pop("kind"), **fields)
    record.flush_events()
    if data_root is not None:
        details = {"expected_root_hash": data_root, "root_hash": data_root, "verified": True}
        record.write_json("preflight.json", {"checks": [{"name": "data", "details": details}]})
    return record


def test_diff_of_runs_with_nothing_in_common_is_neither_reproduced_nor_bitwise(
    tmp_path: Path,
) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    # Same data, but no metric, no loss and no output: nothing about the result was compared.
    a = _record(ws, "a", [], data_root="xxh3_128:aa")
    b = _record(ws, "b", [], data_root="xxh3_128:aa")
    d = diff_runs(a, b)
    assert d.reproduced is False and d.bitwise is False
    text = format_run_diff(d)
    first = text.splitlines()[0]
    assert "bitwise" not in first and "reproduced within" not in first
    assert "nothing to compare" in first
    assert "not compared: metrics" in text and "loss curve" in text and "output hashes" in text


def test_diff_names_what_was_and_was_not_compared(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    steps = [{"kind": "step", "step": s, "loss": 1.0 / (s + 1)} for s in range(5)]
    a = _record(ws, "a", [*steps, {"kind": "metric", "name": "acc", "value": 0.5}], None)
    b = _record(ws, "b", [*steps, {"kind": "metric", "name": "acc", "value": 0.5}], None)
    d = diff_runs(a, b)
    assert d.reproduced is True and d.bitwise is True
    first = format_run_diff(d).splitlines()[0]
    assert "1 metric and the loss at 5 steps exactly equal" in first
    assert d.to_dict()["compared"] == {"data": False, "metrics": 1, "loss_steps": 5, "outputs": 0}
    assert "output hashes (neither run registered an output)" in d.to_dict()["not_compared"]
    assert "  not compared: output hashes" in format_run_diff(d)

    # Equal metrics alone: reproduced within tolerance, but "bitwise" needs bytes or losses.
    m = {"kind": "metric", "name": "acc", "value": 0.5}
    only_metrics = diff_runs(_record(ws, "m1", [m], None), _record(ws, "m2", [m], None))
    assert only_metrics.reproduced and not only_metrics.bitwise
    assert only_metrics.conclusion == "reproduced within tolerance: compared 1 metric"

    # Losses only in one run each, no common step: compared nothing, reproduced nothing.
    c = _record(ws, "c", [{"kind": "step", "step": 9, "loss": 0.1}], None)
    e = diff_runs(c, _record(ws, "e", [{"kind": "step", "step": 10, "loss": 0.1}], None))
    assert not e.reproduced and not e.bitwise
    assert "nothing to compare" in e.conclusion


def test_diff_says_bitwise_only_over_output_hashes_and_the_loss(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    out = {"kind": "output", "name": "model", "hash": "xxh3_128:11", "path": "m", "size": 1}
    steps = [{"kind": "step", "step": s, "loss": 0.5} for s in range(3)]
    a = _record(ws, "a", [*steps, dict(out)], None)
    b = _record(ws, "b", [*steps, dict(out)], None)
    d = diff_runs(a, b)
    assert d.reproduced and d.bitwise
    first = format_run_diff(d).splitlines()[0]
    assert "bitwise" in first and "1 output hash" in first and "the loss at 3 steps" in first


# ---- 4. retention applies to the mirror; the ledger counts the mirror's bytes ------------------


def test_retention_deletes_from_a_local_path_mirror_too(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    from acceptrun.checkpoint.mirror import Mirror
    from acceptrun.checkpoint.mirror_remote import remote_steps
    from acceptrun.checkpoint.saver import Checkpointer
    from acceptrun.checkpoint.store import CheckpointStore

    events: list[tuple[str, dict[str, Any]]] = []
    url = str(tmp_path / "other-disk" / "run1")
    store = CheckpointStore(tmp_path / "ckpt", keep_last=2, keep_every=2)
    mirror = Mirror(
        url, state_path=tmp_path / "mirror.json", on_event=lambda k, f: events.append((k, f))
    )
    mirror.start()
    saver = Checkpointer(store, mirror=mirror)
    model = torch.nn.Linear(8, 8)
    for step in range(1, 6):
        saver.save(step, {"model": model}, block=True)
        assert mirror.wait(timeout=60)  # each step up before the next: deletions can run
    saver.close(mirror_timeout=60)

    local = [i.step for i in store.list()]
    assert local == [2, 4, 5]  # the newest 2, and the multiples of 2
    assert remote_steps(url) == local  # the same in the mirror: 1 and 3 went from both
    assert sorted(p.name for p in Path(url).iterdir()) == ["LATEST", "step-2", "step-4", "step-5"]
    deleted = [f["step"] for k, f in events if k == "mirror_delete"]
    assert sorted(deleted) == [1, 3] and all(
        f["bytes"] > 0 for k, f in events if k == "mirror_delete"
    )
    states = {s: e["state"] for s, e in mirror.status().items()}
    assert states == {1: "deleted", 2: "ok", 3: "deleted", 4: "ok", 5: "ok"}


def test_the_newest_verified_step_in_the_mirror_is_never_deleted(tmp_path: Path) -> None:
    from acceptrun.checkpoint.mirror import Mirror
    from acceptrun.checkpoint.mirror_remote import remote_steps

    url = str(tmp_path / "mirror")
    ckpt = tmp_path / "ckpt"
    mirror = Mirror(url, state_path=tmp_path / "mirror.json")
    mirror.start()
    mirror.enqueue(1, make_checkpoint(ckpt, 1))
    assert mirror.wait(timeout=30)
    # Retention dropped step 1 locally while step 2 is not mirrored yet: 1 is the only
    # verified copy off the machine, so it stays.
    mirror.retire(1)
    assert mirror.wait(timeout=30)
    assert remote_steps(url) == [1]
    assert mirror.status()[1]["state"] == "ok"
    # Once step 2 is verified in the mirror, step 1 goes.
    mirror.enqueue(2, make_checkpoint(ckpt, 2))
    assert mirror.wait(timeout=30)
    mirror.close()
    assert remote_steps(url) == [2]
    assert mirror.status()[1]["state"] == "deleted"

    # A later attempt (a new Mirror on the same state file) finishes a pending deletion.
    again = Mirror(url, state_path=tmp_path / "mirror.json")
    again.retire(2)  # step 2 is the newest verified one: kept
    again.close()
    third = Mirror(url, state_path=tmp_path / "mirror.json")
    third.start()
    third.enqueue(3, make_checkpoint(ckpt, 3))
    assert third.wait(timeout=30)
    third.close()
    assert remote_steps(url) == [3]


# ---- 6. howto and portability notice what a clone lacks ------------------------------------------


def test_a_workspace_named_in_a_project_directory_never_ignores_the_project(
    tmp_path: Path,
) -> None:
    from acceptrun.record.workspace import find_workspace

    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print(1)\n")
    ws = find_workspace(project, create=True)  # `acceptrun --workspace . run ...` in a project
    assert ws.root == project and (project / "runs").is_dir()
    assert not (project / ".gitignore").exists()
    # A directory of acceptrun's own, named by --workspace, does ignore itself.
    records = find_workspace(tmp_path / "records", create=True)
    assert (records.root / ".gitignore").read_text().splitlines()[-1] == "*"
