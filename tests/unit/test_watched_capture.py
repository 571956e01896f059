"""A script's own checkpoints captured and put back, without a run: resume flags under
torchrun, the step from a name, a file refused until complete (real runs:
tests/integration/test_watched_checkpoints.py)."""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path

import pytest

from acceptrun.checkpoint.files import SourceChanged, capture, put_back
from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.errors import RecordError
from acceptrun.spec.model import load_spec
from acceptrun.supervisor.dating import step_from_name
from acceptrun.supervisor.external import with_resume_args
from acceptrun.workload.distributed import launch_command
from conftest import Project


def test_resume_args_reach_the_script_under_torchrun(project: Project) -> None:
    """With processes > 1 the arguments follow the script, not torchrun's own options."""
    for command in ('["python", "train.py", "--lr", "3e-4"]', '"python train.py --lr 3e-4"'):
        path = project.root / "spec.toml"
        path.write_text(
            textwrap.dedent(
                f"""
                name = "t"
                command = {command}
                [resources]
                processes = 2
                [checkpoint]
                watch = ["out/checkpoint-*"]
                resume_args = ["--resume_from_checkpoint", "{{checkpoint}}"]
                """
            )
        )
        spec = load_spec(path)
        argv = with_resume_args(launch_command(spec), spec, "/w/out/checkpoint 7")
        words = shlex.split(argv[2]) if spec.shell else argv
        assert "torch.distributed.run" in words
        assert words[-5:] == [
            "train.py", "--lr", "3e-4", "--resume_from_checkpoint", "/w/out/checkpoint 7"
        ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "step"),
    [
        pytest.param("output/checkpoint-500", 500, id="hf"),
        pytest.param("epoch=3-step=900.ckpt", 900, id="lightning"),
        pytest.param("out/ckpt.pt", None, id="none"),
    ],
)
def test_step_from_name(name: str, step: int | None) -> None:
    assert step_from_name(name) == step


def test_capture_and_put_back_a_file_and_a_directory(tmp_path: Path) -> None:
    """files.capture / put_back: bytes verified both ways, put back where asked, atomically."""
    work = tmp_path / "work"
    (work / "out" / "checkpoint-7").mkdir(parents=True)
    (work / "out" / "ckpt.pt").write_bytes(b"weights" * 1000)
    (work / "out" / "checkpoint-7" / "model.pt").write_bytes(b"m" * 5000)
    (work / "out" / "checkpoint-7" / "state.json").write_text('{"global_step": 7}')
    store = CheckpointStore(tmp_path / "store")
    one, stats = capture(store, 3, {"out/ckpt.pt": work / "out" / "ckpt.pt"})
    assert stats.bytes == 7000 and stats.files == 1 and one.meta["external"] is True
    tree, _ = capture(store, 7, {"out/checkpoint-7": work / "out" / "checkpoint-7"})
    assert sorted(tree.files) == [
        "files/out/checkpoint-7/model.pt",
        "files/out/checkpoint-7/state.json",
    ]
    assert store.verify(3).ok and store.verify(7).ok

    # Put back into another workdir (a record resumed elsewhere), replacing what is there.
    other = tmp_path / "other"
    (other / "out" / "checkpoint-7").mkdir(parents=True)
    (other / "out" / "checkpoint-7" / "stale.bin").write_bytes(b"old")
    placed = put_back(tree, {"out/checkpoint-7": other / "out" / "checkpoint-7"})
    assert placed == {"out/checkpoint-7": other / "out" / "checkpoint-7"}
    assert sorted(p.name for p in (other / "out" / "checkpoint-7").iterdir()) == [
        "model.pt",
        "state.json",
    ]
    assert not [p for p in (other / "out").iterdir() if p.name.startswith(".")]  # no leftovers

    # A stored copy that no longer matches its manifest is refused; the target is kept.
    (work / "out" / "ckpt.pt").write_bytes(b"newer")
    blob = one.path / "files" / "out" / "ckpt.pt"
    blob.write_bytes(b"x" + blob.read_bytes()[1:])
    with pytest.raises(RecordError, match="does not match its manifest"):
        put_back(one)
    assert (work / "out" / "ckpt.pt").read_bytes() == b"newer"


def test_capture_refuses_a_file_that_is_not_in_the_state_judged_complete(tmp_path: Path) -> None:
    src = tmp_path / "ckpt.pt"
    src.write_bytes(b"a" * 100)
    st = src.stat()
    store = CheckpointStore(tmp_path / "store")
    with pytest.raises(SourceChanged, match="changed since it was judged complete"):
        capture(store, 1, {"ckpt.pt": src}, expect={"ckpt.pt": {"": (50, st.st_mtime_ns)}})
    assert store.list() == [] and not list((tmp_path / "store").glob(".staging-*"))
    info, _ = capture(
        store, 1, {"ckpt.pt": src}, expect={"ckpt.pt": {"": (st.st_size, st.st_mtime_ns)}}
    )
    assert info.step == 1
