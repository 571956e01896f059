"""Drills of a sharded (FSDP2) script: the sharded load is the restore, saves stay out.

The script (fsdp2_worker.py: 2 ranks under torchrun, gloo, CPU, a tiny FSDP2
model) saves a sharded checkpoint through ``run.checkpoint_store()`` after every 3rd of
12 steps and resumes with ``sharded.load``. ``acceptrun drill SPEC`` runs it as reference,
then killed after its first checkpoint and preempted, and compares the two bitwise (the
step losses and the ``final`` output: every model and optimizer tensor, gathered). Then
``acceptrun ckpt drill`` of the reference run starts it again on 2 ranks: each rank's
``sharded.load`` counts as its restore, the one step it runs is step 11 (the run had
finished), and the sharded save that step makes goes to a scratch store, never into the
run's checkpoint directory, which is the same afterwards, byte for byte and inode for
inode. One module-scoped set of runs feeds every assertion.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.run.drills.operations import DrillReport, run_ops_drill
from acceptrun.run.drills.restore import DrillResult, restore_drill
from acceptrun.workload.contract import DRILL_SCRATCH_PREFIX
from conftest import PYTHON, toml_str

WORKER = Path(__file__).with_name("fsdp2_worker.py")
TOTAL, EVERY = 12, 3  # sharded checkpoints after steps 2, 5, 8 and 11; 8 and 11 kept
LAST = TOTAL - 1
WAIT_S = 300.0  # seconds a 2-rank drill may take on a loaded 2-core machine (torch per rank)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@dataclass
class Drilled:
    ops: DrillReport  # acceptrun drill SPEC
    record: RunRecord  # its reference run, then restore-drilled
    result: DrillResult
    before: dict[str, tuple[Any, ...]]  # the checkpoint directory before the drill
    after: dict[str, tuple[Any, ...]]  # and after it
    events_before: int  # events in the run's record when the drill began


def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``root``: kind, size, mtime (ns), inode, and a file's bytes."""
    out: dict[str, tuple[Any, ...]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        data = path.read_bytes() if path.is_file() else None
        key = path.relative_to(root).as_posix()
        out[key] = (path.is_dir(), st.st_size, st.st_mtime_ns, st.st_ino, data)
    return out


@pytest.fixture(scope="module")
def drilled(tmp_path_factory: pytest.TempPathFactory) -> Drilled:
    base = tmp_path_factory.mktemp("sharded-drill")
    job = base / "job"
    job.mkdir()
    shutil.copy(WORKER, job / WORKER.name)
    (job / "spec.toml").write_text(
        f'name = "shdrill"\ncommand = [{toml_str(PYTHON)}, "{WORKER.name}"]\n'
        f'env = {{ TOTAL = "{TOTAL}", EVERY = "{EVERY}", OMP_NUM_THREADS = "1" }}\n'
        "[resources]\nprocesses = 2\n"
        "[checkpoint]\nkeep_last = 2\n"
        "[limits]\nmax_restarts = 2\n"
    )
    ops = run_ops_drill(job / "spec.toml", workspace=base / "ws")
    record = Workspace(base / "ws").get_run(ops.reference_run)
    before = snapshot(record.checkpoints_dir)
    events_before = len(list(record.events()))
    drill = restore_drill(record, timeout=WAIT_S)
    return Drilled(ops, record, drill, before, snapshot(record.checkpoints_dir), events_before)


def _tail(where: Path) -> str:
    logs = sorted(where.glob("**/stderr.log"))
    return logs[-1].read_text()[-4000:] if logs else "(no stderr.log)"


def test_the_restore_drill_passes_with_every_rank_s_sharded_load(drilled: Drilled) -> None:
    result = drilled.result
    assert result.ok, (result.evidence, _tail(result.log_dir))
    assert result.step == LAST
    assert "restored step 11 with sharded.load on rank 0 of 2" in result.evidence
    assert "on 2 ranks" in result.evidence
    reported = [e for e in drilled.record.events("drill") if e.get("drill") == "restore"]
    by_rank = {e["rank"]: e for e in reported}
    assert sorted(by_rank) == [0, 1] and len(reported) == 2
    for rank, event in by_rank.items():
        assert event["ok"] is True and event["step"] == LAST, event
        assert f"sharded.load on rank {rank} of 2" in event["evidence"]
        assert "ran step 11 (loss=" in event["evidence"]
    doc = drilled.record.read_json("drills/1/result.json")
    assert doc["ok"] is True and doc["checkpoint"].endswith("step-11")


def test_the_drill_leaves_the_run_s_checkpoints_byte_identical(drilled: Drilled) -> None:
    assert sorted(drilled.before) == sorted(drilled.after)
    assert {name for name in drilled.before if "/" not in name} == {
        "COMMITS",
        "LATEST",
        "OWNER.json",
        "step-8",
        "step-11",
    }
    assert drilled.before == drilled.after  # same bytes, sizes, mtimes and inodes
    # The step the drill ran saved (the worker saves after step 11): into a scratch store,
    # which the evidence names, which is gone afterwards, and of which the record says nothing.
    assert "sharded save of step 11 committed to a scratch store" in drilled.result.evidence
    assert list(drilled.record.path.glob(f"{DRILL_SCRATCH_PREFIX}*")) == []
    during = list(drilled.record.events())[drilled.events_before :]
    kinds = sorted({e["kind"] for e in during})
    assert kinds == ["audit", "drill", "drill_start", "workload_start"], kinds
    assert all(e.get("attempt") == 0 for e in during if e["kind"] == "workload_start")


def test_the_operations_drill_passes_bitwise_on_the_sharded_script(drilled: Drilled) -> None:
    ops = drilled.ops
    assert ops.ok, ops.to_dict()
    assert [d["drill"] for d in ops.drills] == ["kill", "preempt"]
    assert all(d["ok"] for d in ops.drills), ops.drills
    assert ops.checkpoints == [2, 5, 8, 11]
    cmp = ops.comparison
    assert cmp["bitwise"] and cmp["equal"] and cmp["steps_compared"] == TOTAL, cmp
    # The final model and optimizer tensors, gathered, hashed: the same bytes in both runs.
    assert cmp["outputs"]["final"]["equal"], cmp["outputs"]
    kill, preempt = ops.restarts
    assert kill.resume_step is not None and kill.resume_step >= 2
    assert preempt.stopped_checkpoint == preempt.resume_step  # the stop's own save
    # Each resumed attempt's sharded.load is its restore: a restored event, timed.
    for restart in ops.restarts:
        assert restart.restore_s is not None and restart.restore_s >= 0, restart
