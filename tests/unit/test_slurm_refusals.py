"""Specs the Slurm backend cannot run are refused (a real Slurm:
tests/integration/test_slurm.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from acceptrun.backends.slurm import JOBS_FILE, submit
from acceptrun.errors import UserError
from acceptrun.record.workspace import Workspace


def slurm_spec(root: Path, command: str, *, grace: str = "15s", extra: str = "") -> Path:
    """A spec for the Slurm backend; its script is never run."""
    root.mkdir(parents=True)
    (root / "train.py").write_text("pass\n")
    spec = root / "spec.toml"
    spec.write_text(
        f'name = "tiny"\ncommand = {command}\n[limits]\ngrace_period = "{grace}"\n'
        f'[slurm]\nsignal_grace = "60s"\n{extra}'
    )
    return spec


def test_specs_slurm_cannot_run_are_refused(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    slow_stop = slurm_spec(tmp_path / "a", f'["{sys.executable}", "train.py"]', grace="90s")
    with pytest.raises(
        UserError, match=r"limits.grace_period = 1m30s is not shorter than slurm.signal_grace"
    ):
        submit(slow_stop, ws)
    nodes = slurm_spec(tmp_path / "b", '"python train.py"', extra="[resources]\nnodes = 2\n")
    with pytest.raises(
        UserError, match=r"resources\.nodes = 2 with command .*needs the command as a list"
    ):
        submit(nodes, ws)
    assert not (ws.root / JOBS_FILE).exists() and not (ws.root / "slurm").exists()
