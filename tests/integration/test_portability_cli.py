"""`acceptrun portability` on a spec file, as a user runs it (the findings:
tests/unit/test_portability.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from acceptrun.verdict.portability_rules import BLOCKER
from builders import LAMBDA_SPEC

PYTHON = sys.executable


def test_portability_cli_on_a_spec_file(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(LAMBDA_SPEC)
    proc = subprocess.run(
        [PYTHON, "-m", "acceptrun", "portability", str(spec)],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # warnings are not blockers
    assert "warning data.path: /lambda/nfs/data/tokens" in proc.stdout
    proc = subprocess.run(
        [PYTHON, "-m", "acceptrun", "portability", "--json", str(spec)],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    data = json.loads(proc.stdout)
    assert data["blockers"] == 0 and data["warnings"] >= 8
    assert all(f["severity"] != BLOCKER for f in data["findings"])
