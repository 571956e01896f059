"""Sharded checkpoints mirrored as ordinary ones: uploads, retention, events, stop, resume.

Runs of 2 ranks under torchrun (gloo, CPU, a tiny FSDP2 model; fsdp2_worker.py)
save a sharded checkpoint every 3rd of 14 steps through ``run.checkpoint_store()`` only,
with ``checkpoint.mirror`` set to a local directory and ``keep_last = 2``. The first runs
uninterrupted. The second is stopped (SIGTERM) while its ranks wait at a gate after step
9: they save step 9 and exit, and the mirror is drained before the workload ends. Its
local checkpoints are then deleted and ``resume --from-mirror`` fetches step 9; the
resumed attempt trains steps 10 to 13 to the same bits as the uninterrupted run. One
module-scoped set of runs feeds every assertion.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from acceptrun.checkpoint import CheckpointStore, sharded
from acceptrun.checkpoint.mirror_remote import remote_steps
from acceptrun.checkpoint.store import LATEST, MANIFEST
from acceptrun.cost.ledger import build_ledger
from acceptrun.record.workspace import RunRecord
from acceptrun.run.launch import launch
from acceptrun.run.lifecycle import resume_run
from conftest import PYTHON, toml_str, wait_for

WORKER = Path(__file__).with_name("fsdp2_worker.py")
TOTAL, EVERY = 14, 3  # checkpoints after steps 2, 5, 8 and 11; keep_last = 2 keeps 8 and 11
SAVED, KEPT = [2, 5, 8, 11], [8, 11]
HOLD_AT = 9  # the stopped run: 2, 5, 8, then 9 at the stop; 8 and 9 kept
WAIT_S = 300.0  # seconds a 2-rank run may take on a loaded 2-core machine (torch per rank)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@dataclass
class Runs:
    record: RunRecord  # the uninterrupted run
    remote: Path  # its mirror root: <checkpoint.mirror>/<run_id>
    stopped: RunRecord  # stopped after step 9, then resumed from the mirror (attempt 2)
    stopped_remote: Path
    after_stop: list[int]  # the steps in its mirror when attempt 1 had ended


def _job(base: Path, name: str, mirror: Path, env: str = "") -> Path:
    job = base / name
    job.mkdir()
    shutil.copy(WORKER, job / WORKER.name)
    (job / "spec.toml").write_text(
        f'name = "{name}"\ncommand = [{toml_str(PYTHON)}, "{WORKER.name}"]\n'
        f'env = {{ TOTAL = "{TOTAL}", EVERY = "{EVERY}", OMP_NUM_THREADS = "1"{env} }}\n'
        "[resources]\nprocesses = 2\n"
        f"[checkpoint]\nkeep_last = 2\nmirror = {toml_str(str(mirror))}\n"
        '[limits]\nmax_restarts = 0\ngrace_period = "60s"\n'
    )
    return job / "spec.toml"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    base = tmp_path_factory.mktemp("sharded-mirror")
    mirror, ws = base / "mirror", base / "ws"
    result = launch(_job(base, "shmirror", mirror), workspace=ws, echo=False)
    record = result.record
    assert result.exit_code == 0, (result.verdict, _tail(record))

    spec = _job(base, "shstop", mirror, env=f', HOLD_AT = "{HOLD_AT}"')
    proc = subprocess.Popen(
        [PYTHON, "-m", "acceptrun", "--workspace", str(ws), "run", "-q", str(spec)],
        cwd=spec.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        held = [spec.parent / f"held-{r}" for r in (0, 1)]
        wait_for(lambda: all(p.exists() for p in held), WAIT_S, 0.1, "both ranks at the gate")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (stopped,) = [RunRecord(p) for p in (ws / "runs").iterdir() if "-shstop-" in p.name]
    stopped_remote = mirror / stopped.run_id
    after_stop = remote_steps(str(stopped_remote)) if stopped_remote.exists() else []

    # The machine is gone with its disk: only the mirror has the checkpoints.
    shutil.rmtree(stopped.checkpoints_dir)
    resumed = resume_run(stopped, from_mirror=True, echo=False)
    assert resumed.exit_code == 0, (resumed.verdict, err[-2000:], _tail(stopped))
    return Runs(record, mirror / record.run_id, stopped, stopped_remote, after_stop)


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
    deleted = {e["step"] for e in record.events("mirror_delete")}
    assert set(ok) - set(KEPT) <= deleted <= set(SAVED) - set(KEPT)  # retired uploads gone
    assert_only_skipped(record, set(SAVED) - set(KEPT))
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


def assert_only_skipped(record: RunRecord, retired: set[int]) -> None:
    """No upload failed; a step retention deleted locally before or during its upload is
    reported "skipped" (mirror_failed, state skipped), which the mirror thread's pace decides."""
    failed = list(record.events("mirror_failed"))
    assert all(e["state"] == "skipped" and e["step"] in retired for e in failed), failed


def _attempt(record: RunRecord, kind: str, attempt: int) -> list[dict[str, Any]]:
    return [e for e in record.events(kind) if e.get("attempt") == attempt]


def test_a_graceful_stop_saves_and_drains_the_mirror_before_the_workload_ends(
    runs: Runs,
) -> None:
    record = runs.stopped
    exit1 = record.read_json("attempts/1/exit.json")
    assert exit1["class"] == "stopped", exit1
    stops = _attempt(record, "stopped", 1)
    assert stops and {e["checkpoint"] for e in stops} == {HOLD_AT}  # no step lost
    assert [e["step"] for e in _attempt(record, "checkpoint_commit", 1)] == [2, 5, 8, HOLD_AT]
    # When attempt 1 had ended, its mirror held the retained steps, the stop's one included.
    assert runs.after_stop == [8, HOLD_AT]
    ok = {e["step"]: e["t"] for e in _attempt(record, "mirror_ok", 1)}
    (end,) = [e for e in _attempt(record, "workload_end", 1) if e.get("rank", 0) == 0]
    assert HOLD_AT in ok and ok[HOLD_AT] <= end["t"]  # drained before the workload ended
    assert _attempt(record, "mirror_behind", 1) == []
    assert_only_skipped(record, {2, 5})


def test_resume_from_the_mirror_restores_the_shards_bitwise(runs: Runs) -> None:
    record = runs.stopped
    (fetched,) = record.events("mirror_fetch")
    assert fetched["step"] == HOLD_AT and fetched["url"] == str(runs.stopped_remote)
    starts = list(record.events("attempt_start"))
    assert [s["resume_step"] for s in starts] == [None, HOLD_AT]
    second = [e["step"] for e in _attempt(record, "step", 2)]
    assert second == list(range(HOLD_AT + 1, TOTAL))  # continued after the fetched step
    assert CheckpointStore(record.checkpoints_dir).verify(HOLD_AT).ok  # fetched, verified
    (out,) = _attempt(record, "output", 2)
    (ref_out,) = runs.record.events("output")
    assert out["name"] == "final" and out["hash"] == ref_out["hash"]  # the same file, byte for byte
    ref = load_file(str(runs.record.path / "outputs" / "final" / "final.safetensors"))
    got = load_file(str(record.path / "outputs" / "final" / "final.safetensors"))
    assert sorted(ref) == sorted(got) and len(ref) > 6  # 4 model tensors, optimizer state
    for name in ref:
        assert ref[name].dtype == got[name].dtype and ref[name].shape == got[name].shape, name
        assert ref[name].numpy().tobytes() == got[name].numpy().tobytes(), f"{name} differs"
