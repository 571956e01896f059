"""An overlapped save holds the state of its step, bit for bit, for one process and 2 ranks.

Real processes (overlap_worker.py: one process, or two gloo ranks saving a gathered
checkpoint) save with the Checkpointer and change their state at once: a forward and an
optimizer step right after the save call, then a whole next step. The background copy is
held until an optimizer step has begun, so only acceptrun's step pre-hook can keep that
step from changing the tensors before they are copied. Each checkpoint is compared byte
for byte with a synchronous snapshot taken before the call. A parameter changed in place
outside any optimizer fails the save (overlap) or is not seen by it (block).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rank_procs import finish_ranks, start_ranks
from safetensors.numpy import load_file

from acceptrun.checkpoint.store import CheckpointStore

WORKER = Path(__file__).with_name("overlap_worker.py")


def run(tmp_path: Path, staging: str, world: int) -> tuple[Path, Path, list[dict[str, object]]]:
    root, out = tmp_path / "ckpt", tmp_path / "out"
    codes, log = finish_ranks(start_ranks(WORKER, staging, root, world, out), "the ranks")
    if any(codes):
        pytest.fail(f"the ranks exited {codes}:\n{log[-6000:]}")
    results = [json.loads((out / f"result-rank{r}.json").read_text()) for r in range(world)]
    return root, out, results


def compare(root: Path, out: Path, step: int, world: int) -> None:
    """Every tensor of the reference is in the checkpoint with the same bytes."""
    step_dir = root / f"step-{step}"
    if world == 1:
        pairs = [(out / f"ref-1-step{step}.safetensors", step_dir / "tensors.safetensors")]
    else:
        pairs = [(out / f"ref-shared-step{step}.safetensors", step_dir / "tensors.safetensors")]
        pairs += [
            (out / f"ref-rank{r}-step{step}.safetensors",
             step_dir / f"rank-{r}" / "tensors.safetensors")
            for r in range(world)
        ]  # fmt: skip
    for ref, saved in pairs:
        expected, got = load_file(str(ref)), load_file(str(saved))
        assert expected and set(expected) <= set(got), (sorted(expected), sorted(got))
        for key, value in expected.items():  # the checkpoint also holds the RNG states
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
            assert got[key].tobytes() == value.tobytes(), f"step {step}: {key} differs"


@pytest.mark.parametrize("world", [1, 2])
def test_an_overlapped_save_holds_its_step_while_the_next_one_runs(
    tmp_path: Path, world: int
) -> None:
    root, out, results = run(tmp_path, "overlap", world)
    # the copy was still held when the optimizer step began: the step had to wait for it
    assert results[0]["held_at_step"] == {"1": True, "2": True}
    stages = [e for e in results[0]["events"] if e["kind"] == "checkpoint_stage"]
    assert [(e["step"], e.get("overlapped")) for e in stages] == [(1, True), (2, True)]
    assert all(e["copy_s"] >= 0 and e["stall_s"] >= e["waited_s"] >= 0 for e in stages)
    for step in (1, 2):
        compare(root, out, step, world)
    # a parameter changed in place before its copy: the save fails on every rank, loudly
    for result in results:
        error = result["errors"]["3"]
        assert "StateChangedDuringCopy" in error and "'model/0.weight'" in error, error
        assert 'staging = "block"' in error
        assert set(result["errors"]) == {"3"}
    assert [i.step for i in CheckpointStore(root).list()] == [1, 2]


@pytest.mark.parametrize("world", [1, 2])
def test_a_blocking_save_copies_everything_in_the_call(tmp_path: Path, world: int) -> None:
    root, out, results = run(tmp_path, "block", world)
    for result in results:
        assert result["errors"] == {}
        stages = [e for e in result["events"] if e["kind"] == "checkpoint_stage"]
        assert [e["step"] for e in stages] == [1, 2, 3]
        assert not any(e.get("overlapped") for e in stages)
    for step in (1, 2, 3):  # step 3's in-place change came after the call: not in it
        compare(root, out, step, world)
