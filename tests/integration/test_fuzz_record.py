"""Fuzzing a real run record: every reading command on every damaged file.

One tiny real run (a few steps, two checkpoints, a metric and an output) is made per
session. Then, for every file in its record, each kind of damage (truncated, emptied,
deleted, random junk, invalid UTF-8, a newer ``format``, a depth bomb of 100,000
brackets, valid JSON nested 70 levels deep, a sparse size bomb past the reader's limit)
is applied to a fresh copy and every reading command runs on it in-process: ``ls``,
``show`` (text and JSON),
``report`` (Markdown and HTML), ``cost show``, ``ckpt ls``, ``ckpt verify`` and ``diff``
against an intact copy of the same run. Each must give a clear error (exit 1 or 2,
``Type: message`` naming the damaged file) or an answer, never a traceback, and never a
wrong verdict: a damaged verdict.json never shows ACCEPTED unless the answer says the
verdict is provisional (computed now from the rest of the record).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.campaign import tally

from acceptrun._util.durable import MAX_JSON_BYTES, MAX_JSONL_LINE_BYTES
from acceptrun.cli.main import main
from acceptrun.spec.load import MAX_TOML_BYTES
from conftest import only_record_in

pytestmark = pytest.mark.slow

FUZZ_COUNTS: dict[str, int] = {}

WORK = """
import pathlib
import numpy as np
import acceptrun

weights = np.random.default_rng(0).normal(size=(2, 1))
run = acceptrun.init()
start = run.restore(weights=weights)
for step in run.steps(start, 4):
    run.log(step, loss=1.0 / (step + 1))
    if step % 2 == 1:
        run.checkpoint(step, block=True)
run.metric("acc", 0.95)
pathlib.Path("out").mkdir(exist_ok=True)
pathlib.Path("out/model.txt").write_text("weights")
run.output("model", "out/model.txt")
"""

SPEC = """
name = "fz"
command = [{python}, "work.py"]
[acceptance]
metrics = {{ acc = ">= 0.9" }}
outputs = ["model"]
"""


@pytest.fixture(scope="session")
def real_record(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A workspace holding one real, ACCEPTED run: (workspace, run id)."""
    root = tmp_path_factory.mktemp("fuzz-record")
    (root / "work.py").write_text(textwrap.dedent(WORK))
    (root / "spec.toml").write_text(SPEC.format(python=json.dumps(sys.executable)))
    ws = root / ".acceptrun"
    proc = subprocess.run(
        [sys.executable, "-m", "acceptrun", "--workspace", str(ws), "run", "-q", "spec.toml"],
        cwd=root, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    return ws, only_record_in(ws).run_id


def _files(record: Path) -> list[str]:
    return sorted(p.relative_to(record).as_posix() for p in record.rglob("*") if p.is_file())


def _truncate(path: Path, rng: random.Random) -> bool:
    data = path.read_bytes()
    path.write_bytes(data[: rng.randrange(len(data))] if data else b"")
    return bool(data)


def _empty(path: Path, rng: random.Random) -> bool:
    path.write_bytes(b"")
    return True


def _delete(path: Path, rng: random.Random) -> bool:
    path.unlink()
    return True


def _junk(path: Path, rng: random.Random) -> bool:
    path.write_bytes(rng.randbytes(max(16, path.stat().st_size)))
    return True


def _bad_utf8(path: Path, rng: random.Random) -> bool:
    data = path.read_bytes()
    i = rng.randrange(len(data)) if data else 0
    path.write_bytes(data[:i] + b"\xff\xfe\xc3(" + data[i:])
    return True


def _newer_format(path: Path, rng: random.Random) -> bool:
    """A JSON object file written by a newer acceptrun (format 99)."""
    try:
        doc = json.loads(path.read_bytes())
    except ValueError:
        return False
    if not isinstance(doc, dict):
        return False
    doc["format"] = 99
    path.write_text(json.dumps(doc))
    return True


def _plant(path: Path, bomb: bytes, toml: bytes) -> bool:
    """Put ``bomb`` where the file's reader parses it: a line of a JSONL file, the
    whole of any other file (``toml`` for a TOML one)."""
    if path.suffix == ".jsonl":
        data = path.read_bytes()
        path.write_bytes(data + (b"" if data.endswith(b"\n") or not data else b"\n") + bomb + b"\n")
    else:
        path.write_bytes(toml if path.suffix == ".toml" else bomb)
    return True


def _depth_bomb(path: Path, rng: random.Random) -> bool:
    """100,000 unclosed brackets: a recursive parser's stack, exhausted."""
    return _plant(path, b"[" * 100_000, b"x = " + b"[" * 100_000)


def _deep_dict(path: Path, rng: random.Random) -> bool:
    """Valid JSON (or TOML) nested 70 levels deep: past every reader's depth limit."""
    deep = b'{"a":' * 70 + b"1" + b"}" * 70
    return _plant(path, deep, b"a." * 69 + b"a = 1\n")


def _size_bomb(path: Path, rng: random.Random) -> bool:
    """The file (a JSONL file's new last line) grown past its reader's size limit.

    Sparse: the hole costs no disk, and a reader that read it all would still pay for
    every byte of it.
    """
    with open(path, "r+b") as f:
        size = f.seek(0, 2)
        if path.suffix == ".jsonl":
            f.write(b'{"kind": "step", "pad": "')
            f.truncate(size + MAX_JSONL_LINE_BYTES + 1)
            f.seek(0, 2)
            f.write(b'"}\n')
        else:
            f.truncate(max(size, MAX_JSON_BYTES, MAX_TOML_BYTES) + 1)
    return True


DAMAGE: dict[str, Callable[[Path, random.Random], bool]] = {
    "truncate": _truncate,
    "empty": _empty,
    "delete": _delete,
    "junk": _junk,
    "bad-utf8": _bad_utf8,
    "newer-format": _newer_format,
    "depth-bomb": _depth_bomb,
    "deep-dict": _deep_dict,
    "size-bomb": _size_bomb,
}


def _commands(run_id: str, good: str, out: Path) -> list[list[str]]:
    return [
        ["ls"],
        ["show", run_id],
        ["show", "--json", run_id],
        ["report", "--format", "md", run_id],
        ["report", "--format", "html", "-o", str(out / "report.html"), run_id],
        ["cost", "show", run_id],
        ["ckpt", "ls", run_id],
        ["ckpt", "verify", run_id],
        ["diff", good, run_id],
    ]


def _answers_about_damage(cmd: list[str], rc: int, out: str) -> bool:
    """Exit 1 that is the command's own answer about the record, not an error."""
    if cmd[0] == "diff":
        return rc == 1  # "not reproduced": the damaged run's evidence differs
    if cmd[:2] == ["ckpt", "verify"]:
        return rc == 1 and "FAILED verification" in out
    return False


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_every_reader_on_every_damaged_file(
    real_record: tuple[Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    source, run_id = real_record
    good = run_id[:-4] + "good"  # an intact copy of the same run, for diff
    rng = random.Random(f"record-{kind}")
    problems: list[str] = []
    cases = 0
    for i, name in enumerate(_files(source / "runs" / run_id)):
        ws = tmp_path / f"ws-{i}"
        shutil.copytree(source, ws)
        shutil.copytree(ws / "runs" / run_id, ws / "runs" / good)
        (ws / "index.sqlite").unlink(missing_ok=True)  # rebuilt from the records
        if not DAMAGE[kind](ws / "runs" / run_id / name, rng):
            shutil.rmtree(ws)  # nothing to damage this way (an empty file, not JSON)
            continue
        cases += 1
        for cmd in _commands(run_id, good, tmp_path):
            where = f"{name} ({kind}): acceptrun {' '.join(cmd)}"
            capsys.readouterr()
            try:
                rc = main(["--workspace", str(ws), *cmd])
            except BaseException as exc:  # a traceback: the one thing never allowed
                problems.append(f"{where}: raised {type(exc).__name__}: {exc}")
                continue
            out, err = capsys.readouterr()
            FUZZ_COUNTS["record commands"] = FUZZ_COUNTS.get("record commands", 0) + 1
            if rc not in (0, 1, 2):
                problems.append(f"{where}: exit {rc}")
            elif rc != 0 and not _answers_about_damage(cmd, rc, out):
                first = err.strip().splitlines()[0] if err.strip() else ""
                if not (first.split(":")[0].endswith("Error") and Path(name).name in err):
                    problems.append(f"{where}: exit {rc} without naming {name}: {err[:300]!r}")
            if name == "verdict.json" and "ACCEPTED" in out and "provisional" not in out:
                problems.append(f"{where}: shows ACCEPTED from a damaged verdict.json")
            if name == "verdict.json" and kind != "delete" and '"accepted": true' in out:
                problems.append(f"{where}: shows accepted from a damaged verdict.json")
        shutil.rmtree(ws)
    FUZZ_COUNTS[f"record {kind}"] = cases
    raised = sum(" raised " in p for p in problems)
    tally("record files (real commands)", tried=cases * len(_commands(run_id, good, tmp_path)),
          tracebacks=raised)  # fmt: skip
    print(f"\nrecord damage {kind!r}: {cases} files damaged, {len(problems)} problems")
    assert cases > 0
    assert problems == [], "\n".join(problems)
