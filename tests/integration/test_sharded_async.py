"""Asynchronous sharded saves: 2 FSDP2 ranks on CPU/gloo train on while the save is written.

The ranks are real processes (sharded_async_worker.py; the model, training step and
gathered reference tensors are sharded_worker.py's). Each held background write waits
on an event the training thread sets, and the tests wait on files, so no timing decides
a result.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from rank_procs import TIMEOUT, finish_ranks, start_ranks
from safetensors.numpy import load_file
from test_sharded_checkpoint import run_ranks, same_bits

from acceptrun.checkpoint import CheckpointStore, sharded
from acceptrun.checkpoint.mirror_remote import remote_steps
from acceptrun.checkpoint.store import LATEST
from acceptrun.errors import RecordError
from acceptrun.run.launch import launch
from conftest import PYTHON, toml_str, wait_for

WORKER = Path(__file__).with_name("sharded_async_worker.py")


def start(mode: str, root: Path, world: int, out: Path) -> list[subprocess.Popen[str]]:
    return start_ranks(WORKER, mode, root, world, out)


def finish(procs: list[subprocess.Popen[str]]) -> tuple[list[int], str]:
    return finish_ranks(procs, "the ranks")


def events(out: Path, rank: int) -> list[dict[str, object]]:
    path = out / f"events-rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One 2-rank run: steps 1 and 2 saved asynchronously, step 3's save failing."""
    base = tmp_path_factory.mktemp("sharded-async")
    codes, log = finish(start("save", base / "ckpt", 2, base / "out"))
    if any(codes):
        pytest.fail(f"the save ranks exited {codes}:\n{log[-6000:]}")
    return base / "ckpt", base / "out"


@pytest.mark.slow
def test_async_save_commits_while_training_goes_on(saved: tuple[Path, Path]) -> None:
    root, out = saved
    store = CheckpointStore(root)
    assert [i.step for i in store.list()] == [1, 2]
    for step in (1, 2):
        info = store.get(step)
        assert info is not None and store.verify(step).ok
        assert sorted(info.files) == [sharded.METADATA, "shard-0.bin", "shard-1.bin"]
        assert info.meta["format"] == sharded.FORMAT and info.meta["async"] is True
    assert not [p for p in root.iterdir() if p.name.startswith(".staging")]
    figures = json.loads((out / "save-2.json").read_text())
    assert figures["nbytes"] > 0 and figures["persist_s"] > 0
    rank0 = events(out, 0)
    stages = [e for e in rank0 if e["kind"] == "checkpoint_stage"]
    assert [e["step"] for e in stages] == [1, 2, 3] and all(e["bytes"] > 0 for e in stages)
    assert [e["step"] for e in rank0 if e["kind"] == "checkpoint_commit"] == [1, 2]
    assert not [e for e in events(out, 1) if e["kind"] == "checkpoint_commit"]  # rank 0 commits


@pytest.mark.slow
@pytest.mark.parametrize("world", [pytest.param(2, id="2-ranks"), pytest.param(1, id="1-rank")])
def test_restore_is_bitwise_the_state_at_the_call(
    saved: tuple[Path, Path], tmp_path: Path, world: int
) -> None:
    # The parameters changed (a training step, then +1000 in place) after async_save
    # returned and before its background write began; the checkpoint must not see it.
    root, out = saved
    run_ranks("load", root, world, tmp_path)  # sharded_worker: no unpickling, latest = 2
    same_bits(out / "ref-2.safetensors", tmp_path / "loaded.safetensors")
    assert json.loads((tmp_path / "loaded.json").read_text())["step"] == 2
    ref, after = (
        load_file(str(out / "ref-2.safetensors")),
        load_file(str(out / "after.safetensors")),
    )
    changed = [k for k in ref if k.startswith("model.") and ref[k].tobytes() != after[k].tobytes()]
    assert changed == sorted(k for k in ref if k.startswith("model."))  # the mutation was real


@pytest.mark.slow
def test_background_write_failure_is_raised_on_every_rank(saved: tuple[Path, Path]) -> None:
    root, out = saved
    for rank in (0, 1):
        error = (out / f"step3-error-rank{rank}.txt").read_text()
        assert error.startswith("RecordError: the sharded save of step 3 failed"), error
        assert "Nothing was committed" in error
        failed = [e for e in events(out, rank) if e["kind"] == "checkpoint_failed"]
        assert [e["step"] for e in failed] == [3]
    assert "File too large" in (out / "step3-error-rank1.txt").read_text()  # rank 1's EFBIG
    assert (root / LATEST).read_text() == "step-2\n"
    assert not (root / "step-3").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".staging")]


@pytest.mark.slow
def test_rank_killed_during_background_write_commits_nothing(tmp_path: Path) -> None:
    root, out = tmp_path / "ckpt", tmp_path / "out"
    procs = start("kill", root, 2, out)
    try:
        wait_for(
            lambda: all((out / f"rank{r}-ready").exists() for r in (0, 1)),
            timeout=TIMEOUT,
            what="both ranks to have trained on with the save of step 2 in flight",
        )
        assert (root / "step-1").is_dir() and not (root / "step-2").exists()
        procs[1].send_signal(signal.SIGKILL)  # in the middle of writing its shard file
    finally:
        codes, log = finish(procs)
    assert codes == [3, -signal.SIGKILL], f"{codes}:\n{log[-6000:]}"
    error = (out / "rank0-error.txt").read_text()
    assert "step 2" in error and "Nothing was committed" in error
    assert (root / LATEST).read_text() == "step-1\n"
    assert not (root / "step-2").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".staging")]  # rank 0 aborted
    assert CheckpointStore(root).verify(1).ok


@pytest.mark.slow
def test_exit_waits_for_the_save_and_reports_a_failed_one(tmp_path: Path) -> None:
    root, out = tmp_path / "ckpt", tmp_path / "out"
    root.mkdir()
    codes, log = finish(start("exit", root, 1, out))
    assert codes == [0], log
    info = CheckpointStore(root).get(7)
    assert info is not None and CheckpointStore(root).verify(7).ok
    assert f"the sharded save of step 7 in {root / 'blocker' / 'ckpt'} was NOT committed" in log
    assert [e["kind"] for e in events(out, 0)] == ["checkpoint_stage", "checkpoint_commit"]


def test_unreported_failure_is_raised_by_the_next_save(tmp_path: Path) -> None:
    """One process: a failed save nobody waited for stops the next one from starting."""
    (tmp_path / "blocker").write_text("not a directory\n")
    seen: list[tuple[str, dict[str, object]]] = []
    store = CheckpointStore(
        tmp_path / "blocker" / "ckpt", on_event=lambda k, f: seen.append((k, f))
    )
    first = sharded.async_save(store, 1, {"w": torch.ones(3)})
    with pytest.raises(RecordError, match=r"step 1 .* was not committed .*step 2 was not started"):
        sharded.async_save(store, 2, {"w": torch.ones(3)})
    assert first.done()
    with pytest.raises(
        RecordError, match=r"the sharded save of step 1 failed .*Nothing was committed"
    ):
        sharded.wait(store)  # a finished save's outcome stays readable
    assert [k for k, _ in seen] == ["checkpoint_stage", "checkpoint_failed"]
    good = CheckpointStore(tmp_path / "ok")
    w = torch.arange(6, dtype=torch.float32)
    pending = sharded.async_save(good, 4, {"w": w, "meta": {"ids": [1, 2]}})
    w.add_(1)
    assert pending.result().step == 4 and sharded.wait(good) == pending.result()
    state = {"w": torch.zeros(6), "meta": {"ids": []}}
    assert sharded.load(good, state) is not None
    assert torch.equal(state["w"], torch.arange(6, dtype=torch.float32))


@pytest.mark.slow
def test_run_finish_waits_for_the_save_before_the_mirror_drains(tmp_path: Path) -> None:
    script = Path(__file__).with_name("sharded_async_run.py")
    job, mirror = tmp_path / "job", tmp_path / "mirror"
    job.mkdir()
    shutil.copy(script, job / script.name)
    (job / "spec.toml").write_text(
        f'name = "shasync"\ncommand = [{toml_str(PYTHON)}, "{script.name}"]\n'
        'env = { OMP_NUM_THREADS = "1" }\n'
        f"[checkpoint]\nkeep_last = 2\nmirror = {toml_str(str(mirror))}\n"
        "[limits]\nmax_restarts = 0\n"
    )
    result = launch(job / "spec.toml", workspace=tmp_path / "ws", echo=False)
    record = result.record
    commits = [e["step"] for e in record.events("checkpoint_commit")]
    assert commits == [0, 1, 2, 3], (result.verdict, commits)
    assert [e["step"] for e in record.events("checkpoint_stage")] == [0, 1, 2, 3]
    assert not list(record.events("checkpoint_failed"))
    assert remote_steps(str(mirror / record.run_id)) == [2, 3]  # step 3 reached the mirror
    state = {"w": torch.zeros(10_000), "train": {"step": -1}}
    info = sharded.load(CheckpointStore(record.checkpoints_dir), state)
    assert info is not None and info.step == 3 and state["train"]["step"] == 3
    assert torch.equal(state["w"], torch.full((10_000,), 4.0))


@pytest.mark.slow
def test_an_overlapped_copy_holds_its_step_while_the_next_step_runs(tmp_path: Path) -> None:
    """async_save(overlap=opt) on 2 FSDP2 ranks: the next step right after the call waits
    for the background copy, so the checkpoint is its step's, bit for bit; a parameter
    changed in place outside the optimizer before its copy fails the save on every rank."""
    root, out = tmp_path / "ckpt", tmp_path / "out"
    codes, log = finish(start("overlap", root, 2, out))
    if any(codes):
        pytest.fail(f"the overlap ranks exited {codes}:\n{log[-6000:]}")
    for rank in (0, 1):
        doc = json.loads((out / f"overlap-rank{rank}.json").read_text())
        # the copy was still held when step 2's optimizer step began: it had to wait
        assert doc["held_at_step"][0] is True
        assert "was changed in place after async_save()" in doc["step2_error"], doc
        assert "overlap=None" in doc["step2_error"]
    stages = [e for e in events(out, 0) if e["kind"] == "checkpoint_stage"]
    assert [(e["step"], e.get("overlapped")) for e in stages] == [(1, True)]
    assert [i.step for i in CheckpointStore(root).list()] == [1]
    run_ranks("load", root, 2, tmp_path / "loaded")
    same_bits(out / "ref-1.safetensors", tmp_path / "loaded" / "loaded.safetensors")
