"""Preflight names the interpreter it asked and how it found it.

The run's `python` may be another environment than the one acceptrun runs in (a PATH
that puts another venv first): "found nothing" alone sent a user looking in the wrong one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Project


@pytest.fixture(scope="module")
def other_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real interpreter other than this one: a fresh venv with nothing installed."""
    root = tmp_path_factory.mktemp("other") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)  # fmt: skip
    return root / "bin" / "python"


@pytest.mark.parametrize("form", ["on-path", "absolute", "shebang"])
def test_a_missing_package_names_the_interpreter_asked_and_how(
    project: Project, other_python: Path, form: str
) -> None:
    assert Path(sys.executable) != other_python
    path = f"{other_python.parent}:/usr/bin:/bin"
    if form == "shebang":
        script = project.root / "train"
        script.write_text("#!/usr/bin/env python\nprint('must not run')\n")
        script.chmod(0o755)
        command, how = ["./train"], f'(the #! line "/usr/bin/env python" of {script}, found on PATH'
    elif form == "absolute":
        command, how = [str(other_python), "work.py"], f'(the command\'s "{other_python}")'
    else:
        command, how = ["python", "work.py"], '(the command\'s "python", found on PATH from [env])'
    spec = project.spec(
        "print('must not run')",
        command=command,
        extra=f'[env]\nPATH = "{path}"\n[expect]\npackages = {{ acceptrun = ">=0" }}\n',
    )
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    proc = subprocess.run(
        [sys.executable, "-m", "acceptrun", "--workspace", str(project.workspace), "run",
         str(spec)], cwd=project.root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    record = project.only_record()
    pre = json.loads((record.path / "preflight.json").read_text())
    (check,) = [c for c in pre["checks"] if c["name"] == "expectations"]
    # Each form finds the same interpreter (the #! line names env, which finds python on
    # the job's PATH), and says how.
    expected = f"package acceptrun: expected >=0, found nothing in {other_python} {how}"
    assert check["message"].startswith(expected), check["message"]
    assert expected in proc.stdout + proc.stderr  # what the user reads as preflight runs
    assert "must not run" not in proc.stdout
