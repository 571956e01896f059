"""The package as it is built: the sdist rebuilds the same wheel, and the wheel holds the sources.

From a copy of the checkout's tracked and new files (what a clone holds), the build
backend named in pyproject.toml (setuptools, through its PEP 517 hooks, as ``python -m
build --no-isolation`` calls them) makes the sdist; pip builds one wheel from the copy
and one from the unpacked sdist. Both wheels hold the same files with the same bytes, and
every file under ``src/acceptrun`` that git knows is in them (a new data file the
package-data list forgets fails here, not on a user's machine). ``acceptrun export
wheel`` run from the checkout gives a wheel of the same sources and leaves nothing in the
checkout (pip builds a directory in place: it builds a copy).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import acceptrun

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    return [ln for ln in out.stdout.splitlines() if ln and (ROOT / ln).is_file()]


def _wheel(source: Path, out: Path) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("acceptrun-*.whl")
    return wheel


def _contents(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        return {
            n: hashlib.sha256(zf.read(n)).hexdigest()
            for n in zf.namelist()
            if not n.endswith(".dist-info/RECORD")  # the list of the others, in build order
        }


def test_the_sdist_rebuilds_the_wheel_and_the_wheel_holds_every_source(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    files = _tracked()
    for rel in files:
        (clone / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, clone / rel)
    sdist_dir = tmp_path / "sdist"
    built = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
         "print(b.build_sdist(sys.argv[1]))", str(sdist_dir)],
        cwd=clone, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    sdist = sdist_dir / built.stdout.strip().splitlines()[-1]
    assert sdist.name == f"acceptrun-{acceptrun.__version__}.tar.gz"
    with tarfile.open(sdist) as tf:
        tf.extractall(tmp_path / "unpacked", filter="data")
    from_clone = _contents(_wheel(clone, tmp_path / "w1"))
    from_sdist = _contents(
        _wheel(tmp_path / "unpacked" / sdist.name[: -len(".tar.gz")], tmp_path / "w2")
    )
    assert from_sdist == from_clone
    sources = {rel.removeprefix("src/") for rel in files if rel.startswith("src/acceptrun/")}
    in_wheel = {n for n in from_clone if not n.split("/")[0].endswith(".dist-info")}
    assert in_wheel == sources


def _untracked_and_ignored() -> list[str]:
    """What the checkout holds beside its tracked files, but compiled caches (other tests
    running beside this one write those) and the test tools' own folders."""
    lines = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=all"], cwd=ROOT,
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    skip = ("__pycache__", ".pyc", ".hypothesis", "_cache", ".venv")
    return [ln for ln in lines if not any(s in ln for s in skip)]


def test_export_wheel_from_the_checkout_holds_its_sources_and_writes_nothing_there(
    tmp_path: Path,
) -> None:
    before = _untracked_and_ignored()
    done = subprocess.run(
        [sys.executable, "-m", "acceptrun", "export", "wheel", "-o", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = tmp_path.glob("acceptrun-*.whl")
    assert wheel.name == f"acceptrun-{acceptrun.__version__}-py3-none-any.whl"
    assert f"RUN python -m pip install /tmp/{wheel.name}" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [wheel.name]  # no build folder left
    sources = {rel.removeprefix("src/") for rel in _tracked() if rel.startswith("src/acceptrun/")}
    in_wheel = {n for n in _contents(wheel) if not n.split("/")[0].endswith(".dist-info")}
    assert in_wheel == sources
    assert _untracked_and_ignored() == before  # no build/, no egg-info change in the checkout
