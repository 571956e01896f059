"""Sharded checkpoints mirrored as ordinary ones: uploads, retention, events, resume.

One run of 2 ranks under torchrun (gloo, CPU, a tiny FSDP2 model; sharded_mirror_worker.py)
saves a sharded checkpoint every 3rd of 14 steps through ``run.checkpoint_store()`` only,
with ``checkpoint.mirror`` set to a local directory and ``keep_last = 2``. A copy of its
record, with the local checkpoints deleted, is then resumed from the mirror: the resumed
attempt loads step 11 from the fetched shards and trains steps 12 and 13 to the same
bits as the uninterrupted run. One module-scoped pair of runs feeds every assertion.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from safetensors.torch import load_file

from acceptrun.checkpoint import CheckpointStore, sharded
from acceptrun.checkpoint.mirror import remote_steps
from acceptrun.checkpoint.store import LATEST, MANIFEST
from acceptrun.cost.ledger import build_ledger
from acceptrun.record.workspace import RunRecord
from acceptrun.run.launch import launch
from acceptrun.run.lifecycle import resume_run
from conftest import PYTHON, toml_str

WORKER = Path(__file__).with_name("sharded_mirror_worker.py")
TOTAL, EVERY = 14, 3  # checkpoints after steps 2, 5, 8 and 11; keep_last = 2 keeps 8 and 11
SAVED, KEPT = [2, 5, 8, 11], [8, 11]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@dataclass
class Runs:
    record: RunRecord  # the uninterrupted run
    remote: Path  # its mirror root: <checkpoint.mirror>/<run_id>
    resumed: RunRecord  # a copy of its record, local checkpoints deleted, resumed from the mirror


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    base = tmp_path_factory.mktemp("sharded-mirror")
    job = base / "job"
    job.mkdir()
    shutil.copy(WORKER, job / WORKER.name)
    mirror = base / "mirror"
    (job / "spec.toml").write_text(
        f'name = "shmirror"\ncommand = [{toml_str(PYTHON)}, "{WORKER.name}"]\n'
        f'env = {{ TOTAL = "{TOTAL}", EVERY = "{EVERY}", OMP_NUM_THREADS = "1" }}\n'
        "[resources]\nprocesses = 2\n"
        f"[checkpoint]\nkeep_last = 2\nmirror = {toml_str(str(mirror))}\n"
        '[limits]\nmax_restarts = 0\ngrace_period = "60s"\n'
    )
    result = launch(job / "spec.toml", workspace=base / "ws", echo=False)
    record = result.record
    assert result.exit_code == 0, (result.verdict, _tail(record))

    # The record carried to another machine, without its checkpoints: only the mirror has them.
    copy = RunRecord(shutil.copytree(record.path, base / "elsewhere" / "runs" / record.run_id))
    shutil.rmtree(copy.checkpoints_dir)
    shutil.rmtree(copy.path / "outputs")  # the resumed attempt writes its own final tensors
    resumed = resume_run(copy, from_mirror=True, force=True, echo=False)
    assert resumed.exit_code == 0, (resumed.verdict, _tail(copy))
    assert resumed.from_step == KEPT[-1]
    return Runs(record, mirror / record.run_id, copy)


def _tail(record: RunRecord) -> str:
    logs = sorted(record.path.glob("attempts/*/stderr.log"))
    return logs[-1].read_text()[-4000:] if logs else "(no stderr.log)"


def test_mirror_holds_the_retained_steps_with_the_manifests_hashes(runs: Runs) -> None:
    local = CheckpointStore(runs.record.checkpoints_dir)
    assert [i.step for i in local.list()] == KEPT
    assert remote_steps(str(runs.remote)) == KEPT  # retention applied in the mirror too
    assert {p.name for p in runs.remote.iterdir() if p.is_dir()} == {f"step-{s}" for s in KEPT}
    assert (runs.remote / LATEST).read_text() == f"step-{KEPT[-1]}\n"
    # The mirror root has the store's layout, so the store verifies it: every file re-hashed.
    remote = CheckpointStore(runs.remote)
    for step in KEPT:
        info = remote.get(step)
        assert info is not None
        assert sorted(info.files) == [sharded.METADATA, "shard-0.bin", "shard-1.bin"]
        assert info.meta["format"] == sharded.FORMAT and info.meta["world_size"] == 2
        assert remote.verify(step).ok, remote.verify(step).problems
        here = runs.record.checkpoints_dir / f"step-{step}"
        assert (runs.remote / f"step-{step}" / MANIFEST).read_bytes() == (
            here / MANIFEST
        ).read_bytes()


def test_record_has_the_mirror_events_and_the_ledger_counts_them(runs: Runs) -> None:
    record = runs.record
    commits = [e["step"] for e in record.events("checkpoint_commit")]
    assert commits == SAVED
    assert sorted(e["step"] for e in record.events("checkpoint_delete")) == [2, 5]
    ok = {e["step"]: e for e in record.events("mirror_ok")}
    # A retired step may have been skipped (deleted locally before its upload began):
    # that depends on the mirror thread's speed; the kept ones are always uploaded.
    assert set(KEPT) <= set(ok) <= set(SAVED)
    deleted = sorted(e["step"] for e in record.events("mirror_delete"))
    assert deleted == sorted(set(ok) - set(KEPT))  # every upload retention retired is gone
    assert list(record.events("mirror_failed")) == []
    assert list(record.events("mirror_behind")) == []  # drained at exit
    for step in KEPT:
        files = runs.remote / f"step-{step}"
        on_remote = sum(p.stat().st_size for p in files.rglob("*") if p.is_file())
        assert ok[step]["bytes"] == on_remote
    states = json.loads((record.path / "mirror.json").read_text())["steps"]
    assert {int(s) for s, e in states.items() if e["state"] == "ok"} == set(KEPT)
    checks = {c["name"]: c for c in record.read_json("verdict.json")["checks"]}
    assert checks["mirror"]["status"] == "pass", checks["mirror"]
    mirror = build_ledger(record)["storage"]["mirror"]
    assert {i["step"] for i in mirror["items"]} == set(ok)
    assert mirror["left_bytes"] == sum(ok[s]["bytes"] for s in KEPT)


def test_resume_from_the_mirror_restores_the_shards_bitwise(runs: Runs) -> None:
    copy = runs.resumed
    (fetched,) = copy.events("mirror_fetch")
    assert fetched["step"] == KEPT[-1] and fetched["url"] == str(runs.remote)
    starts = list(copy.events("attempt_start"))
    assert [s["resume_step"] for s in starts] == [None, KEPT[-1]]
    second = [e["step"] for e in copy.events("step") if e["attempt"] == 2]
    assert second == list(range(KEPT[-1] + 1, TOTAL))  # continued after the fetched step
    assert CheckpointStore(copy.checkpoints_dir).verify(KEPT[-1]).ok
    (out,) = [e for e in copy.events("output") if e["attempt"] == 2]
    (ref_out,) = runs.record.events("output")
    assert out["name"] == "final" and out["hash"] == ref_out["hash"]  # the same file, byte for byte
    ref = load_file(str(runs.record.path / "outputs" / "final" / "final.safetensors"))
    got = load_file(str(copy.path / "outputs" / "final" / "final.safetensors"))
    assert sorted(ref) == sorted(got) and len(ref) > 6  # 4 model tensors, optimizer state
    for name in ref:
        assert ref[name].dtype == got[name].dtype and ref[name].shape == got[name].shape, name
        assert ref[name].numpy().tobytes() == got[name].numpy().tobytes(), f"{name} differs"
