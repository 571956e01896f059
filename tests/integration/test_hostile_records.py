"""Hostile content in the files a user's commands read, tried with real ``acceptrun`` commands.

One real run per module: checkpoints at steps 1, 3 and 5, then attempt 1 fails at step
6 (the run is REJECTED and resumable). On copies of its workspace:

- the newest step's MANIFEST.json replaced by a depth bomb (100,000 ``[``, or valid JSON
  nested 70 levels deep): ``ckpt ls`` and ``ckpt verify`` answer, naming step 5, and
  ``acceptrun resume`` quarantines it and continues from step 3;
- events.jsonl (a new line), verdict.json, ledger.json, run.json and exit.json, each alone
  and all at once, made a depth bomb, valid JSON too deep, a sparse size bomb or invalid
  UTF-8: ``show`` (text, JSON), ``report`` (Markdown, HTML), ``ls``, ``cost show`` and
  ``ckpt ls`` answer, or fail naming a damaged file;
- the workspace without index.sqlite made read-only by a read-only bind mount (root;
  skipped where ``mount`` is refused): ``ls`` and ``show`` list the run with a note;
- a data manifest that is a depth bomb, valid JSON too deep, a sparse size bomb or
  invalid UTF-8: ``data verify`` and the preflight of ``acceptrun run`` refuse it naming
  the file.

Every command: exit 0, 1 or 2, never a traceback. Each record file under every kind of
damage is tests/integration/test_fuzz_record.py's business; this module runs the
commands as a user does, in child processes, where a resume really restores.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.campaign import tally

from acceptrun._util.durable import read_jsonl
from acceptrun.capture.data import MAX_DATA_MANIFEST_BYTES

pytestmark = pytest.mark.slow

PYTHON = sys.executable

WORK = """
import os
import numpy as np
import acceptrun

weights = np.random.default_rng(0).normal(size=(2, 1))
run = acceptrun.init()
start = run.restore(weights=weights)
for step in run.steps(start, 8):
    run.log(step, loss=1.0 / (step + 1))
    if step % 2 == 1:
        run.checkpoint(step, block=True)
    if step == 6 and os.environ["ACCEPTRUN_ATTEMPT"] == "1":
        raise SystemExit("the first attempt stops here")
run.metric("acc", 0.95)
"""

SPEC = """
name = "hostile"
command = [{python}, "work.py"]
[checkpoint]
keep_last = 3
[limits]
max_restarts = 0
[acceptance]
metrics = {{ acc = ">= 0.9" }}
"""

DATA_SPEC = """
name = "hostile-data"
command = [{python}, "-c", "pass"]
[data]
path = "data"
manifest = "data.manifest.json"
"""

BOMBS = {
    "brackets": b"[" * 100_000,
    "deep-dict": b'{"a":' * 70 + b"1" + b"}" * 70,
}


def _cli(ws: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", "--workspace", str(ws), *args],
        capture_output=True, text=True, timeout=300, check=False, cwd=cwd,
    )  # fmt: skip


def _clean(done: subprocess.CompletedProcess[str], what: str) -> None:
    """Exit 0, 1 or 2, and no traceback."""
    assert done.returncode in (0, 1, 2), (what, done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, (what, done.stderr)


@dataclass
class Failed:
    root: Path  # the working directory: work.py, spec.toml
    ws: Path
    run_id: str


@pytest.fixture(scope="module")
def failed(tmp_path_factory: pytest.TempPathFactory) -> Failed:
    root = tmp_path_factory.mktemp("hostile")
    (root / "work.py").write_text(textwrap.dedent(WORK))
    (root / "spec.toml").write_text(SPEC.format(python=json.dumps(PYTHON)))
    ws = root / ".acceptrun"
    done = _cli(ws, "run", "-q", "spec.toml", cwd=root)
    assert done.returncode != 0 and "REJECTED" in done.stdout, (done.stdout, done.stderr)
    (run_id,) = [p.name for p in (ws / "runs").iterdir()]
    steps = sorted(p.name for p in (ws / "runs" / run_id / "checkpoints").glob("step-*"))
    assert steps == ["step-1", "step-3", "step-5"], steps
    return Failed(root, ws, run_id)


def _copy(failed: Failed, tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(failed.ws, ws)
    return ws


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_manifest_bomb_in_the_newest_step_is_quarantined_and_the_previous_used(
    failed: Failed, tmp_path: Path, bomb: str
) -> None:
    ws = _copy(failed, tmp_path)
    run_dir = ws / "runs" / failed.run_id
    (run_dir / "checkpoints" / "step-5" / "MANIFEST.json").write_bytes(BOMBS[bomb])
    listed = _cli(ws, "ckpt", "ls", failed.run_id, cwd=failed.root)
    _clean(listed, "ckpt ls")
    assert listed.returncode == 0, listed.stderr
    steps = [line.split()[0].rstrip("*") for line in listed.stdout.splitlines()[1:3]]
    assert steps == ["1", "3"], listed.stdout  # the good ones listed
    assert "step 5: damaged, not listed: step-5/MANIFEST.json: not valid JSON" in listed.stdout
    verify = _cli(ws, "ckpt", "verify", failed.run_id, cwd=failed.root)
    _clean(verify, "ckpt verify")
    assert verify.returncode == 1 and "step-5: FAILED verification" in verify.stdout, verify.stdout
    assert "step-5/MANIFEST.json: not valid JSON" in verify.stdout, verify.stdout
    resumed = _cli(ws, "resume", failed.run_id, cwd=failed.root)
    _clean(resumed, "resume")
    assert resumed.returncode == 0 and "ACCEPTED" in resumed.stdout, resumed.stdout + resumed.stderr
    events = list(read_jsonl(run_dir / "events.jsonl"))
    quarantined = [e for e in events if e.get("kind") == "checkpoint_quarantine"]
    assert [e.get("step") for e in quarantined] == [5], quarantined
    restored = [e for e in events if e.get("kind") == "restored" and e.get("attempt") == 2]
    assert [e["step"] for e in restored] == [3], restored
    tally("checkpoint metadata (real resume)", tried=3, tracebacks=0)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[list[Path]]:
    mounted: list[Path] = []
    yield mounted
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_ls_and_show_on_a_read_only_workspace_without_its_index(
    failed: Failed, tmp_path: Path, read_only: list[Path]
) -> None:
    ws = _copy(failed, tmp_path)
    (ws / "index.sqlite").unlink(missing_ok=True)
    for extra in ws.glob("index.sqlite-*"):  # -wal, -shm, -journal
        extra.unlink()
    bind = subprocess.run(["mount", "--bind", str(ws), str(ws)], capture_output=True, text=True)
    if bind.returncode != 0:
        pytest.skip(f"cannot bind-mount here (root needed): {bind.stderr}")
    read_only.append(ws)
    subprocess.run(["mount", "-o", "remount,ro,bind", str(ws)], check=True)
    assert subprocess.run(["touch", str(ws / "probe")], capture_output=True).returncode != 0
    tried = 0
    for args in (("ls",), ("ls", "--all"), ("show", failed.run_id)):
        done = _cli(ws, *args, cwd=failed.root)
        tried += 1
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, (args, done.stderr)
        assert failed.run_id in done.stdout, (args, done.stdout)
        if args[0] == "ls":
            said = done.stdout + done.stderr
            assert "index.sqlite cannot be used" in said, (args, said)
            assert "runs listed from their directories" in said, (args, said)
    assert not (ws / "index.sqlite").exists()
    tally("storage faults", tried=tried, tracebacks=0)


RECORD_FILES = ("events.jsonl", "verdict.json", "ledger.json", "run.json", "attempts/1/exit.json")
READERS = (
    ("show",), ("show", "--json"), ("report", "--format", "md"),
    ("report", "--format", "html", "-o", "report-copy.html"), ("ls",), ("cost", "show"),
    ("ckpt", "ls"), ("bundle", "--force", "-o", "bundle-copy.tar.gz"),
)  # fmt: skip


def _bomb_file(path: Path, kind: str) -> None:
    """``kind`` planted in ``path``: a JSONL file gets it as a new line, others as a whole."""
    if kind == "size-bomb":  # sparse: past the 64 MiB (a JSONL line: 16 MiB) limit
        with open(path, "r+b") as f:
            f.write(b'{"kind": "step", "pad": "')
            f.truncate(f.seek(0, 2) + (65 << 20))
        return
    bomb = b'{"kind": "step", "\xff\xfe": 1}' if kind == "bad-utf8" else BOMBS[kind]
    if path.suffix == ".jsonl":
        path.write_bytes(path.read_bytes() + bomb + b"\n")
    else:
        path.write_bytes(bomb)


@pytest.mark.parametrize("kind", [*sorted(BOMBS), "size-bomb", "bad-utf8"])
def test_the_reading_commands_on_hostile_record_files(
    failed: Failed, tmp_path: Path, kind: str
) -> None:
    """Each file alone, then all at once; every reading command, as a child process."""
    tried = 0
    for damaged in [*((name,) for name in RECORD_FILES), RECORD_FILES]:
        ws = tmp_path / f"ws-{len(damaged)}-{damaged[0].replace('/', '-')}"
        shutil.copytree(failed.ws, ws)
        (ws / "index.sqlite").unlink(missing_ok=True)
        run_dir = ws / "runs" / failed.run_id
        for name in damaged:
            _bomb_file(run_dir / name, kind)
        for args in READERS:
            tried += 1
            run = [] if args == ("ls",) else [failed.run_id]
            done = _cli(ws, *args, *run, cwd=tmp_path)
            _clean(done, f"{' '.join(args)} with {kind} in {', '.join(damaged)}")
            if done.returncode != 0:
                named = [n for n in damaged if Path(n).name in done.stderr]
                assert named, (args, damaged, done.stderr)
        shutil.rmtree(ws)
    tally("record files (real commands)", tried=tried, tracebacks=0)


DATA_DAMAGE = {**BOMBS, "bad-utf8": b'{"files": {"\xff\xfe": 1}}'}


@pytest.mark.parametrize("kind", [*sorted(DATA_DAMAGE), "size-bomb"])
def test_a_hostile_data_manifest_is_refused_naming_it(tmp_path: Path, kind: str) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("a")
    (tmp_path / "spec.toml").write_text(DATA_SPEC.format(python=json.dumps(PYTHON)))
    ws = tmp_path / ".acceptrun"
    made = _cli(ws, "data", "snapshot", "data", "-o", "data.manifest.json", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    manifest = tmp_path / "data.manifest.json"
    if kind == "size-bomb":  # sparse, past the manifest limit: refused by its size, unread
        with open(manifest, "r+b") as f:
            f.truncate(MAX_DATA_MANIFEST_BYTES + 1)
    else:
        manifest.write_bytes(DATA_DAMAGE[kind])
    verify = _cli(ws, "data", "verify", "data", "data.manifest.json", cwd=tmp_path)
    _clean(verify, "data verify")
    assert verify.returncode != 0 and "data.manifest.json" in verify.stderr, verify.stderr
    run = _cli(ws, "run", "-q", "spec.toml", cwd=tmp_path)
    _clean(run, "run")
    assert run.returncode != 0, run.stdout
    assert "data.manifest.json" in run.stdout + run.stderr, run.stdout + run.stderr
    tally("data manifests (real commands)", tried=2, tracebacks=0)
