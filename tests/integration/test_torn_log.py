"""A full disk tears the last line of events.jsonl; the resume repairs it and says why.

The workspace is a 24 MiB tmpfs (``mount``, as root here and in CI's container when it
permits mounts; skipped elsewhere). At step 12 the workload fills it, as another process
on the same disk would, then logs a burst of metrics (events.jsonl; steps are in the step
log, whose own tears tests/integration/test_steplog_torn.py covers): the first line that
crosses the end of events.jsonl's last page is written in part, and the rest fails with a
real ``ENOSPC``: the last line is torn. The workload dies of
the error (its traceback fits in stderr.log's page), the supervisor cannot write the
attempt's exit.json and exits with a clear error. Once there is space, ``acceptrun
resume`` continues the run: its audit event is a line of its own after a ``log_repaired``
event (never glued onto the fragment), every other line parses, and the verdict names
the full disk of attempt 1 (class ``disk_full``), instead of a silent "interrupted".
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.campaign import tally

from acceptrun._util.durable import read_jsonl
from acceptrun.record.steplog import StepLog

pytestmark = pytest.mark.slow

PYTHON = sys.executable
TMPFS = "24m"  # preflight's storage probe writes 8 MiB; the record a few hundred KiB

WORK = """
import pathlib, sys, time
import numpy as np
import acceptrun

weights = np.random.default_rng(0).normal(size=(2, 1))
run = acceptrun.init()
start = run.restore(weights=weights)
print("training starts", file=sys.stderr, flush=True)  # stderr.log holds a page from here
fill = pathlib.Path("fill-at")
for step in run.steps(start, 3000):
    run.log(step, loss=1.0 / (step + 1))
    if step in (4, 9):
        run.checkpoint(step, block=True)
    if step == 12 and fill.exists():
        target = pathlib.Path(fill.read_text().strip())
        fill.unlink()  # only the first attempt fills the disk
        run.metric("before_fill", 1.0)  # writes the held steps to the step log first
        try:  # another process fills the disk
            with open(target, "wb") as f:
                while True:
                    f.write(b"x" * 4096)
                    f.flush()
        except OSError:
            pass
        # A burst of events: the one that crosses the last page of events.jsonl is torn.
        for i in range(200):
            run.metric(f"burst/{i:03d}", float(i))
run.metric("acc", 0.95)
"""

SPEC = """
name = "torn"
command = [{python}, "work.py"]
[limits]
max_restarts = 1
restart_backoff = 0
[acceptance]
metrics = {{ acc = ">= 0.9" }}
"""


def _cli(ws: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", "--workspace", str(ws), *args],
        capture_output=True, text=True, timeout=300, check=False, cwd=cwd,
    )  # fmt: skip


@dataclass
class Torn:
    run_dir: Path
    first: subprocess.CompletedProcess[str]  # the run that met the full disk
    torn_tail: bytes  # the end of events.jsonl after it
    resumed: subprocess.CompletedProcess[str]
    show: subprocess.CompletedProcess[str]

    def events(self, kind: str) -> list[dict[str, Any]]:
        if kind == "step":  # the step log (record format 2)
            return StepLog(self.run_dir).events()
        return [e for e in read_jsonl(self.run_dir / "events.jsonl") if e.get("kind") == kind]


@pytest.fixture(scope="module")
def torn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Torn]:
    tmp = tmp_path_factory.mktemp("torn")
    ws = tmp / ".acceptrun"
    ws.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS}", "tmpfs", str(ws)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root needed): {mounted.stderr.decode()}")
    try:
        (tmp / "work.py").write_text(textwrap.dedent(WORK))
        (tmp / "spec.toml").write_text(SPEC.format(python=json.dumps(PYTHON)))
        filler = ws / "filler"
        (tmp / "fill-at").write_text(str(filler))
        first = _cli(ws, "run", "-q", "spec.toml", cwd=tmp)
        (run_dir,) = list((ws / "runs").iterdir())
        torn_tail = (run_dir / "events.jsonl").read_bytes()[-4096:]
        filler.unlink()  # space again
        resumed = _cli(ws, "resume", run_dir.name, cwd=tmp)
        show = _cli(ws, "show", run_dir.name, cwd=tmp)
        yield Torn(run_dir, first, torn_tail, resumed, show)
    finally:
        subprocess.run(["umount", "-l", str(ws)], check=False)


def test_the_full_disk_tore_the_last_line_and_the_supervisor_said_so(torn: Torn) -> None:
    assert torn.first.returncode != 0, torn.first.stdout
    assert "Traceback" not in torn.first.stderr, torn.first.stderr
    assert "disk full" in torn.first.stderr and "exit.json" in torn.first.stderr
    assert not torn.torn_tail.endswith(b"\n"), torn.torn_tail[-200:]


def test_every_line_parses_but_the_kept_fragment(torn: Torn) -> None:
    assert torn.resumed.returncode == 0, torn.resumed.stdout + torn.resumed.stderr
    (repaired,) = torn.events("log_repaired")
    assert repaired["torn_bytes"] > 0, repaired
    raw = (torn.run_dir / "events.jsonl").read_bytes()
    fragment = raw[repaired["offset"] : repaired["offset"] + repaired["torn_bytes"]]
    assert torn.torn_tail.endswith(fragment), (fragment, torn.torn_tail[-200:])
    bad = []
    for line in raw.split(b"\n")[:-1]:
        try:
            json.loads(line)
        except ValueError:
            bad.append(line)
    assert bad == [fragment], bad  # the fragment stays as evidence, and only it
    # The resume's audit event is a line of its own, written after the repair.
    kinds = [e["kind"] for e in read_jsonl(torn.run_dir / "events.jsonl")]
    at = kinds.index("log_repaired")
    audits = [e for e in torn.events("audit") if e.get("action") == "resume"]
    assert len(audits) == 1 and "audit" in kinds[at + 1 :], kinds[at:]
    tally("storage faults", tried=1, tracebacks=0)


def test_the_verdict_names_the_full_disk_of_attempt_1(torn: Torn) -> None:
    exit1 = json.loads((torn.run_dir / "attempts" / "1" / "exit.json").read_text())
    assert exit1["outcome"] == "interrupted" and exit1["class"] == "disk_full", exit1
    assert any("No space left on device" in line for line in exit1["evidence"]), exit1
    verdict = json.loads((torn.run_dir / "verdict.json").read_text())
    checks = {c["name"]: c for c in verdict["checks"]}
    failures = checks["failures"]["evidence"]
    assert failures.startswith("attempt 1: disk_full (disk full: "), failures
    assert "No space left on device" in failures, failures
    # The lost work is counted from the events the disk let through, and said to be a
    # lower bound: the workload may have run steps nobody could record.
    steps = [e["step"] for e in torn.events("step") if e.get("attempt") == 1]
    kept = max(e["step"] for e in torn.events("checkpoint_commit") if e["step"] <= max(steps))
    work = exit1["work"]
    assert work["lost_at_least"] is True and work["last_step"] == max(steps), work
    assert work["steps_lost"] == max(steps) - kept, (work, kept)
    assert f"lost at least {max(steps) - kept} step" in failures, failures
    # A full disk, recovered by a resume once there was space: the rules accept the run
    # and the record says what happened on the way.
    assert verdict["verdict"] == "accepted", verdict["verdict"]
    assert "attempt 1: disk_full" in torn.resumed.stdout, torn.resumed.stdout
    (audit,) = [e for e in torn.events("audit") if e.get("action") == "resume"]
    assert audit["interrupted"]["class"] == "disk_full", audit


def test_show_reports_the_damaged_line_without_a_traceback(torn: Torn) -> None:
    assert torn.show.returncode == 0, torn.show.stderr
    assert "Traceback" not in torn.show.stderr, torn.show.stderr
    assert "events.jsonl line " in torn.show.stdout, torn.show.stdout
    assert "disk_full" in torn.show.stdout, torn.show.stdout
