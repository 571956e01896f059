"""Hostile paths in a real run: ``[cleanup] remove`` never reaches past the workdir's own files.

One real ``acceptrun run`` of a tiny script whose workdir holds the workspace, the
checkpoint store, the data and a symlink to a directory outside it, with cleanup globs
that match each: nothing outside is touched (a hash of the victim tree before and after),
the symlink alone goes, the workspace, the store and the data stay, every refusal is a
``cleanup`` event with ``ok: false`` and its reason, and the verdict's cleanup line fails
instead of saying ✓. Globs that lead out in their text (``../victim/*``, an absolute
path) are refused before the run starts, naming the field and the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.campaign import tally

from acceptrun.record.workspace import RunRecord

pytestmark = pytest.mark.slow

PYTHON = sys.executable
WORK = """\
import pathlib
pathlib.Path("scratch").mkdir(exist_ok=True)
pathlib.Path("scratch/tmp.bin").write_bytes(b"scratch")
print("step 1 loss 0.5", flush=True)
"""


def tree_hash(root: Path) -> str:
    """One hash of every name, link target and file content under ``root``."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = Path(dirpath, name)
            h.update(str(p.relative_to(root)).encode() + b"\0")
            if p.is_symlink():
                h.update(os.readlink(p).encode())
            elif p.is_file():
                h.update(p.read_bytes())
    return h.hexdigest()


def acceptrun(cwd: Path, ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", "--workspace", str(ws), *args],
        cwd=cwd, capture_output=True, text=True, timeout=600, check=False, env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def cleaned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The run, with what was there before it: paths, victim hash, process result."""
    root = tmp_path_factory.mktemp("hostile-paths")
    victim = root / "victim"
    (victim / "deep").mkdir(parents=True)
    (victim / "precious.txt").write_text("not the run's to remove")
    (victim / "deep" / "more.txt").write_text("nor this")
    proj = root / "proj"
    proj.mkdir()
    (proj / "work.py").write_text(WORK)
    (proj / "outlink").symlink_to(victim, target_is_directory=True)
    (proj / "data").mkdir()
    (proj / "data" / "train.txt").write_text("the data")
    globs = [
        "outlink/*",  # (a) through a symlink: the victim's files
        "outlink",  # (a) the symlink itself: removed as a link
        ".*",  # (b) matches .acceptrun, the workspace (inside the workdir here)
        "ckpt",  # (c) the run's checkpoint store
        "ckpt/*",  # (c) inside it
        "data",  # (d) the data path
        "scratch/*",  # what the run wrote: removed
    ]
    (proj / "spec.toml").write_text(
        f'name = "paths"\ncommand = [{json.dumps(PYTHON)}, "work.py"]\n'
        '[data]\npath = "data"\n'
        '[checkpoint]\ndir = "ckpt"\n'
        f"[cleanup]\nremove = {json.dumps(globs)}\n"
    )
    ws = proj / ".acceptrun"
    (proj / "ckpt").mkdir()
    (proj / "ckpt" / "keep.txt").write_text("a store's file")
    before = tree_hash(victim)
    proc = acceptrun(proj, ws, "run", "-q", "spec.toml")
    runs = [p for p in (ws / "runs").iterdir() if (p / "run.json").exists()]
    assert len(runs) == 1, (proc.stdout, proc.stderr)
    return {"root": root, "proj": proj, "victim": victim, "ws": ws, "before": before,
            "proc": proc, "record": RunRecord(runs[0]), "globs": globs}  # fmt: skip


def test_nothing_outside_the_workdir_is_touched(cleaned: dict[str, object]) -> None:
    victim = cleaned["victim"]
    assert isinstance(victim, Path)
    after = tree_hash(victim)
    outside = int(after != cleaned["before"])
    tally("cleanup globs", tried=len(cleaned["globs"]), tracebacks=0, outside=outside)  # type: ignore[arg-type]
    assert outside == 0
    assert (victim / "precious.txt").read_text() == "not the run's to remove"


def test_the_symlink_alone_goes_and_the_run_s_own_files_too(cleaned: dict[str, object]) -> None:
    proj = cleaned["proj"]
    assert isinstance(proj, Path)
    assert not os.path.lexists(proj / "outlink")
    assert not (proj / "scratch" / "tmp.bin").exists()


def test_workspace_store_and_data_stay(cleaned: dict[str, object]) -> None:
    proj, record = cleaned["proj"], cleaned["record"]
    assert isinstance(proj, Path) and isinstance(record, RunRecord)
    assert (proj / ".acceptrun" / "runs").is_dir() and (record.path / "run.json").is_file()
    assert (proj / "ckpt" / "keep.txt").read_text() == "a store's file"
    assert (proj / "data" / "train.txt").read_text() == "the data"


def test_refusals_are_recorded_and_the_cleanup_line_fails(cleaned: dict[str, object]) -> None:
    record, proc = cleaned["record"], cleaned["proc"]
    assert isinstance(record, RunRecord) and isinstance(proc, subprocess.CompletedProcess)
    events = {e["remove"]: e for e in record.events("cleanup") if "remove" in e}
    for glob in ("outlink/*", ".*", "ckpt", "ckpt/*", "data"):
        e = events[glob]
        assert e["ok"] is False and e["detail"].startswith("refused"), e
    assert "outside the workdir" in events["outlink/*"]["detail"]
    assert "workspace" in events[".*"]["detail"]
    assert events["outlink"]["ok"] is True and events["scratch/*"]["ok"] is True
    verdict = json.loads((record.path / "verdict.json").read_text())
    (check,) = [c for c in verdict["checks"] if c["name"] == "cleanup"]
    assert check["status"] == "fail" and "refused" in check["evidence"], check
    assert "✓ cleanup" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "glob",
    [pytest.param("../victim/*", id="parent"), pytest.param("ABS", id="absolute")],
)
def test_globs_that_lead_out_are_refused_before_the_run(tmp_path: Path, glob: str) -> None:
    """The issue's examples: these removed files outside the workdir, and the verdict said ✓."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "work.py").write_text(WORK)
    glob = str(victim) if glob == "ABS" else glob
    (proj / "spec.toml").write_text(
        f'name = "out"\ncommand = [{json.dumps(PYTHON)}, "work.py"]\n'
        f"[cleanup]\nremove = [{json.dumps(glob)}]\n"
    )
    before = tree_hash(victim)
    proc = acceptrun(proj, tmp_path / ".acceptrun", "run", "-q", "spec.toml")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "cleanup.remove" in proc.stderr and "inside the workdir" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert tree_hash(victim) == before
    assert not (tmp_path / ".acceptrun" / "runs").exists() or not any(
        (tmp_path / ".acceptrun" / "runs").iterdir()
    )
    tally("cleanup globs", tried=1, tracebacks=0, outside=int(tree_hash(victim) != before))
