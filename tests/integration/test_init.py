"""`acceptrun init` for a script that saves its own checkpoints, as a real command."""

from __future__ import annotations

import subprocess
import tomllib

import pytest

from conftest import PYTHON, Project


def _init(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    # stdin is not a terminal: init never asks, whatever the flags.
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", "init", *args], cwd=project.root, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "watch", "resume_args"),
    [
        (["--own-checkpoints", "out/ckpt.pt", "--resume-args=--init_from=resume"],
         ["out/ckpt.pt"], ["--init_from=resume"]),
        (["--own-checkpoints", "output/checkpoint-*",
          "--resume-args=--resume_from_checkpoint {checkpoint}"],
         ["output/checkpoint-*"], ["--resume_from_checkpoint", "{checkpoint}"]),
        (["--own-checkpoints", "out/ckpt.pt"], ["out/ckpt.pt"], None),
    ],
    ids=["nanogpt", "trainer", "flag-to-fill-in"],
)  # fmt: skip
def test_init_with_own_checkpoints_writes_a_spec_that_checks(
    project: Project, flags: list[str], watch: list[str], resume_args: list[str] | None
) -> None:
    proc = _init(project, "spec.toml", "--command", "python train.py", *flags)
    assert proc.returncode == 0, proc.stderr
    written = tomllib.loads((project.root / "spec.toml").read_text())
    assert written["checkpoint"]["watch"] == watch
    assert written["checkpoint"].get("resume_args") == resume_args
    assert "progress" in written  # the table is there, its pattern commented to fill in
    check = project.cli("spec", "check", "spec.toml")
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--own-checkpoints", "../elsewhere/ckpt.pt"], "checkpoint.watch"),
        (["--own-checkpoints", "/abs/ckpt.pt"], "inside the workdir"),
        (["--resume-args=--resume"], "--resume-args needs --own-checkpoints"),
        (["--own-checkpoints", "a", "--resume-args='x"], "quote it as a shell would"),
    ],
)
def test_init_refuses_what_cannot_make_a_spec(
    project: Project, flags: list[str], said: str
) -> None:
    proc = _init(project, "spec.toml", *flags)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (project.root / "spec.toml").exists()
