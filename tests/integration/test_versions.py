"""Which acceptrun wrote a record, and a newer release's record refused by this one.

The newer release is real code run for real: a copy of this checkout's sources with the
version raised to 99.0.0 and the record format to one above this one's (what the next
release that changes the record will be), run as its own ``python -m acceptrun`` with
that copy first on ``PYTHONPATH``. It makes a run; this acceptrun, asked to show, report
or resume that run, refuses, naming the file, the version that wrote it and the one to
install, and changes nothing in the record. A Kubernetes Job exported by this acceptrun
stops in an image that holds the other one, before any run, saying which to install.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import acceptrun
from acceptrun.record.models import FORMAT

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
NEXT = "99.0.0"
SPEC = f'name = "versions"\ncommand = [{json.dumps(PYTHON)}, "-c", "print(1)"]\n'


def _env(src: Path | None = None, path_first: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
    env.pop("PYTHONPATH", None)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    if path_first is not None:
        env["PATH"] = f"{path_first}:{env.get('PATH', '')}"
    return env


def _acceptrun(cwd: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", *args], cwd=cwd, env=env, capture_output=True,
        text=True, timeout=600, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def next_release(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The next release's sources, and a ``bin/acceptrun`` that runs them."""
    root = tmp_path_factory.mktemp("next")
    src = root / "src"
    shutil.copytree(
        ROOT / "src" / "acceptrun", src / "acceptrun",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )  # fmt: skip
    init = src / "acceptrun" / "_version.py"
    text, n = re.subn(r'__version__ = "[^"]+"', f'__version__ = "{NEXT}"', init.read_text())
    assert n == 1
    init.write_text(text)
    models = src / "acceptrun" / "record" / "models.py"
    text, n = re.subn(r"^FORMAT = \d+$", f"FORMAT = {FORMAT + 1}", models.read_text(), flags=re.M)
    assert n == 1
    models.write_text(text)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    launcher = bin_dir / "acceptrun"
    launcher.write_text(f'#!/bin/sh\nPYTHONPATH={src} exec {PYTHON} -m acceptrun "$@"\n')
    launcher.chmod(0o755)
    return {"src": src, "bin": bin_dir}


def _tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_every_record_file_says_which_acceptrun_wrote_it(tmp_path: Path) -> None:
    (tmp_path / "spec.toml").write_text(SPEC)
    done = _acceptrun(tmp_path, "--workspace", "ws", "run", "-q", "spec.toml", env=_env())
    assert done.returncode == 0, done.stderr
    (record,) = [p for p in (tmp_path / "ws" / "runs").iterdir() if not p.name.startswith(".")]
    stamped = []
    # Generative: whatever record file carries a format number, now or added later, says
    # which acceptrun wrote it (checkpoints carry their own format names).
    for path in sorted(record.rglob("*.json")):
        if "checkpoints" in path.relative_to(record).parts:
            continue
        data = json.loads(path.read_text())
        if isinstance(data, dict) and type(data.get("format")) is int:
            assert data.get("acceptrun_version") == acceptrun.__version__, path
            stamped.append(path.relative_to(record).as_posix())
    assert {"run.json", "verdict.json", "ledger.json", "attempts/1/exit.json"} <= set(stamped)
    prov = json.loads((record / "provenance.json").read_text())
    assert prov["acceptrun"]["version"] == acceptrun.__version__
    assert prov["acceptrun"]["from"] == "checkout"
    shown = _acceptrun(tmp_path, "env", env=_env())  # this machine's capture, summarized
    assert shown.returncode == 0, shown.stderr
    assert re.search(
        rf"^acceptrun {re.escape(acceptrun.__version__)} \(checkout\)", shown.stdout, re.M
    )


def test_a_newer_releases_record_is_refused_with_the_version_to_install(
    tmp_path: Path, next_release: dict[str, Path]
) -> None:
    (tmp_path / "spec.toml").write_text(SPEC)
    newer = _env(src=next_release["src"])
    made = _acceptrun(tmp_path, "--workspace", "ws", "run", "-q", "spec.toml", env=newer)
    assert made.returncode == 0, made.stderr
    (record,) = [p for p in (tmp_path / "ws" / "runs").iterdir() if not p.name.startswith(".")]
    state = json.loads((record / "run.json").read_text())
    assert (state["format"], state["acceptrun_version"]) == (FORMAT + 1, NEXT)
    before = _tree(record)
    for args in (["show", record.name], ["report", record.name], ["show", str(record)],
                 ["resume", record.name, "--force"]):  # fmt: skip
        got = _acceptrun(tmp_path, "--workspace", "ws", *args, env=_env())
        assert got.returncode == 1, (args, got.stdout, got.stderr)  # a RecordError
        assert (
            f"has format {FORMAT + 1}, written by acceptrun {NEXT}; this acceptrun "
            f"{acceptrun.__version__} reads formats up to {FORMAT}: install acceptrun "
            f"{NEXT} or newer (python -m pip install 'acceptrun>={NEXT}'"
        ) in got.stderr, (args, got.stderr)
        assert "Traceback" not in got.stderr
    # Refused, and nothing in the record touched (but the empty lock file resume takes
    # before it reads anything, so that two resumes never read the record at once).
    after = _tree(record)
    assert after.pop(".resume.lock") == hashlib.sha256(b"").hexdigest()
    assert after == before
    # The newer release reads its own record.
    again = _acceptrun(tmp_path, "--workspace", "ws", "show", record.name, env=newer)
    assert again.returncode == 0, again.stderr


def _entrypoint(tmp_path: Path) -> str:
    yaml: Any = pytest.importorskip("yaml")
    (tmp_path / "spec.toml").write_text(SPEC.replace(json.dumps(PYTHON), '"python"'))
    out = _acceptrun(
        tmp_path, "export", "kubernetes", "spec.toml", "--image", "ghcr.io/me/train:1",
        "-o", "job.yaml", env=_env(),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (job,) = [
        d
        for d in yaml.safe_load_all((tmp_path / "job.yaml").read_text())
        if d and d["kind"] == "Job"
    ]
    return str(job["spec"]["template"]["spec"]["containers"][0]["command"][2])


def test_a_kubernetes_job_stops_in_an_image_holding_another_acceptrun(
    tmp_path: Path, next_release: dict[str, Path]
) -> None:
    script = _entrypoint(tmp_path)
    other = subprocess.run(
        ["/bin/sh", "-c", script], cwd=tmp_path, env=_env(path_first=next_release["bin"]),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert other.returncode == 2, (other.stdout, other.stderr)
    assert (
        f"this Job was exported by acceptrun {acceptrun.__version__}, the image holds "
        f"acceptrun {NEXT}: install acceptrun {acceptrun.__version__} in the image"
    ) in other.stderr
    # Only the check, with this acceptrun on PATH: it lets the pod go on.
    check = script[: script.index("\nWS=")] + "\necho checked\n"
    same = subprocess.run(
        ["/bin/sh", "-c", check], cwd=tmp_path, env=_env(path_first=Path(PYTHON).parent),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert (same.returncode, same.stdout.strip()) == (0, "checked"), same.stderr
    none = subprocess.run(
        ["/bin/sh", "-c", check], cwd=tmp_path, env={"PATH": "/nonexistent"},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert none.returncode == 2 and "the image holds no acceptrun" in none.stderr
