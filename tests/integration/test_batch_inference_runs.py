"""Batch inference runs: every input item gets exactly one output, through kills and ranks.

Real ``acceptrun run`` processes run a small labelling workload over a text file: once
uninterrupted (the reference), and again SIGKILLed by the test at random moments after
shard commits (the supervisor restarts it; committed shards are skipped, a half-written
one is redone), which must end with byte-identical output shards. Also: failed items
listed with their errors, the coverage and error-rate checks rejecting a run, a
half-written shard left on disk never counting, two ranks without overlap, a cost per item
limit, and a SIGTERM that finishes the shard in hand (the input forms and the section's
rules, without a process: tests/unit/test_batch_inference.py)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from acceptrun._util.durable import read_jsonl
from acceptrun.record.workspace import RunRecord
from conftest import PYTHON, Project, toml_str, wait_for

WORKLOAD = """
import hashlib, os, time
import acceptrun

delay = float(os.environ.get("ITEM_DELAY", "0"))
fail_every = int(os.environ.get("FAIL_EVERY", "0"))
stop_after = int(os.environ.get("STOP_AFTER", "-1"))
run = acceptrun.init()
for n, shard in enumerate(run.inference.shards()):
    if n == stop_after:
        break
    outputs = []
    for item in shard.items:
        time.sleep(delay)
        if fail_every and item.index % fail_every == 3:
            shard.fail(item, ValueError(f"cannot label item {item.index}"))
            outputs.append(None)
            continue
        digest = hashlib.sha256(item.value.encode()).hexdigest()
        outputs.append({"label": digest[:8], "chars": len(item.value)})
    shard.commit(outputs, tokens=sum(len(v) for v in shard.values))
"""

ITEMS = 120
SHARD = 10


def write_input(root: Path, n: int = ITEMS) -> Path:
    path = root / "items.txt"
    path.write_text("".join(f"sentence number {i} of the test input\n" for i in range(n)))
    return path


def batch_spec(
    project: Project,
    *,
    name: str = "batch",
    output: str = "out",
    env: dict[str, str] | None = None,
    inference: str = "",
    extra: str = "",
) -> Path:
    write_input(project.root)
    env_toml = ", ".join(f"{k} = {toml_str(v)}" for k, v in (env or {}).items())
    text = f"""
    env = {{ {env_toml} }}
    [inference]
    input = "items.txt"
    output = {toml_str(output)}
    shard_size = {SHARD}
    {inference}
    [limits]
    max_restarts = 8
    restart_backoff = 0
    [cost]
    price_per_hour = 0.5
    billing_increment = "1s"
    {extra}
    """
    return project.spec(WORKLOAD, name=name, extra=text, file=f"{name}.toml")


def outputs_of(directory: Path) -> bytes:
    """Every committed output shard, concatenated in shard order."""
    return b"".join(p.read_bytes() for p in sorted(directory.glob("shard-*.jsonl")))


def record_of(project: Project, name: str) -> RunRecord:
    (rid,) = [r for r in project.run_ids() if f"-{name}-" in r]
    return RunRecord(project.runs_dir / rid)


def verdict_check(record: RunRecord, name: str) -> dict[str, Any]:
    verdict = record.read_json("verdict.json")
    return next(c for c in verdict["checks"] if c["name"] == name)


def assert_exactly_once(out_dir: Path, n: int = ITEMS) -> None:
    ids = [json.loads(line)["id"] for line in outputs_of(out_dir).splitlines()]
    assert sorted(ids) == list(range(n)), "an item is missing or written twice"


@pytest.mark.slow
def test_random_kills_end_with_outputs_identical_to_an_uninterrupted_run(
    project: Project,
) -> None:
    ref_spec = batch_spec(project, name="ref", output="ref-out")
    project.cli("run", str(ref_spec), timeout=300, check_rc=0)
    reference = outputs_of(project.root / "ref-out")
    assert_exactly_once(project.root / "ref-out")

    # Items take 20 ms, a shard 200 ms (12 shards: seconds of work left to kill in, even on a
    # loaded machine): a kill lands anywhere in a shard, its commit included.
    spec = batch_spec(project, name="killed", output="killed-out", env={"ITEM_DELAY": "0.02"})
    log = project.root / "killed.log"  # a file, not a pipe nobody reads while it runs
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [PYTHON, "-m", "acceptrun", "--workspace", str(project.workspace), "run", str(spec)],
            cwd=project.root, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    rng = random.Random(7)
    try:
        record = wait_for(lambda: _record_or_none(project, "killed"), 120, what="the record")
        for attempt in (1, 2, 3):
            commits = rng.randint(1, 2)

            def ready(attempt: int = attempt, commits: int = commits) -> int | None:
                events = list(read_jsonl(record.events_path))
                seen = [
                    e for e in events if e["kind"] == "shard_commit" and e["attempt"] == attempt
                ]
                start = [
                    e for e in events if e["kind"] == "workload_start" and e["attempt"] == attempt
                ]
                return start[0]["pid"] if len(seen) >= commits and start else None

            pid = wait_for(ready, 180, what=f"{commits} shard commits of attempt {attempt}")
            # A random moment inside the next shard (items 20 ms each, a shard 200 ms), its
            # commit included; the kill is the point, nothing is asserted after a guess.
            time.sleep(rng.uniform(0, 0.2))
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log.read_text()
    killed_dir = project.root / "killed-out"
    assert outputs_of(killed_dir) == reference, "resumed outputs differ from the uninterrupted run"
    assert_exactly_once(killed_dir)
    exits = [e for e in read_jsonl(record.events_path) if e["kind"] == "attempt_exit"]
    assert len(exits) == 4, exits
    summary = record.read_json("inference.json")
    assert summary["coverage"] == 1.0 and summary["duplicated"] == 0 and summary["missing"] == 0
    assert summary["shards_committed"] == ITEMS // SHARD
    assert verdict_check(record, "coverage")["status"] == "pass"


def _record_or_none(project: Project, name: str) -> RunRecord | None:
    rids = [r for r in project.run_ids() if f"-{name}-" in r]
    return RunRecord(project.runs_dir / rids[0]) if rids else None


@pytest.mark.slow
def test_half_written_shard_is_redone_and_never_counted(project: Project) -> None:
    """Killed right after shard 1's commit, with no restart; a torn shard 2 is planted."""
    spec = batch_spec(project, name="torn", output="torn-out", extra="")
    text = spec.read_text().replace("max_restarts = 8", "max_restarts = 0")
    spec.write_text(text)
    proc = project.cli("run", "--inject", "kill@step=1", str(spec), timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = record_of(project, "torn")
    out_dir = project.root / "torn-out"
    assert sorted(p.name for p in out_dir.glob("shard-*.jsonl")) == [
        "shard-00000.jsonl",
        "shard-00001.jsonl",
    ]
    coverage = verdict_check(record, "coverage")
    assert coverage["status"] == "fail" and "missing 100" in coverage["evidence"]
    work = record.read_json("attempts/1/exit.json")["work"]
    assert work["steps_lost"] == 0, work  # committed shards are kept, not lost work
    # What a kill inside shard 2's write leaves behind: a torn file without a manifest.
    (out_dir / "shard-00002.jsonl").write_bytes(b'{"id":20,"output":{"lab')
    project.cli("resume", record.run_id, timeout=300)
    assert_exactly_once(out_dir)
    assert verdict_check(record, "coverage")["status"] == "pass"
    commits = [e["shard"] for e in read_jsonl(record.events_path) if e["kind"] == "shard_commit"]
    assert commits == list(range(ITEMS // SHARD)), "a committed shard was written again"


@pytest.mark.slow
def test_failed_items_are_listed_and_the_error_rate_rejects(project: Project) -> None:
    spec = batch_spec(
        project, name="failing", env={"FAIL_EVERY": "10"}, inference="max_error_rate = 0.05"
    )
    proc = project.cli("run", str(spec), timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = record_of(project, "failing")
    summary = record.read_json("inference.json")
    assert summary["failed"] == ITEMS // 10 and summary["outputs"] == ITEMS - ITEMS // 10
    assert summary["failed_items"][0] == {"id": 3, "error": "ValueError: cannot label item 3"}
    assert summary["coverage"] == 1.0  # a failure listed with its error is an outcome
    rate = verdict_check(record, "error rate")
    assert rate["status"] == "fail" and rate["required"]
    assert "10.00% of items failed (12)" in rate["evidence"]
    assert verdict_check(record, "coverage")["status"] == "pass"
    assert "error rate" in record.read_json("verdict.json")["failed"]
    show = project.cli("show", record.run_id, check_rc=0).stdout
    assert "coverage: 100.00%: 108 outputs, 12 failed, 0 missing, 0 duplicated" in show
    assert "failed: 3: ValueError: cannot label item 3" in show
    report = (record.path / "report.html").read_text()
    assert '<h2 id="inference">Batch inference</h2>' in report
    assert "cannot label item 13" in report


@pytest.mark.slow
def test_coverage_rejects_a_run_that_skipped_shards(project: Project) -> None:
    spec = batch_spec(project, name="short", env={"STOP_AFTER": "4"})
    proc = project.cli("run", str(spec), timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = record_of(project, "short")
    coverage = verdict_check(record, "coverage")
    assert coverage["status"] == "fail"
    assert "33.33% of 120 items" in coverage["evidence"], coverage
    assert "missing 80" in coverage["evidence"]
    assert "[40, 41, 42, 43, 44]" in coverage["fix"]


@pytest.mark.slow
def test_two_ranks_take_alternate_shards_without_overlap(project: Project) -> None:
    ref_spec = batch_spec(project, name="one", output="one-out")
    project.cli("run", str(ref_spec), timeout=300, check_rc=0)
    spec = batch_spec(project, name="two", output="two-out", extra="[resources]\nprocesses = 2\n")
    proc = project.cli("run", str(spec), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = record_of(project, "two")
    assert outputs_of(project.root / "two-out") == outputs_of(project.root / "one-out")
    assert_exactly_once(project.root / "two-out")
    shards = record.read_json("inference.json")["shards"]
    assert {s["shard"]: s["rank"] for s in shards} == {i: i % 2 for i in range(ITEMS // SHARD)}
    commits = [e for e in read_jsonl(record.events_path) if e["kind"] == "shard_commit"]
    assert sorted(e["shard"] for e in commits) == list(range(ITEMS // SHARD))


@pytest.mark.slow
def test_cost_per_item_limits_reject_an_expensive_run(project: Project) -> None:
    spec = batch_spec(
        project,
        name="pricey",
        inference="max_usd_per_1k_items = 0.000001\nmax_usd_per_million_tokens = 1000000",
    )
    proc = project.cli("run", str(spec), timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = record_of(project, "pricey")
    per_item = verdict_check(record, "cost per 1k items")
    assert per_item["status"] == "fail" and per_item["required"]
    summary = record.read_json("inference.json")
    assert summary["usd_per_1k_items"] == pytest.approx(summary["usd"] * 1000 / ITEMS)
    assert verdict_check(record, "cost per 1M tokens")["status"] == "pass"
    assert summary["tokens"] == sum(
        len(f"sentence number {i} of the test input") for i in range(ITEMS)
    )


# ---- the input and the spec (no process) -----------------------------------------------------


@pytest.mark.slow
def test_sigterm_finishes_the_shard_in_hand_then_resumes(project: Project) -> None:
    """A preemption (SIGTERM right after shard 3 is committed) stops between shards."""
    spec = batch_spec(project, name="term", output="term-out")
    project.cli("run", "--inject", "term@step=3", str(spec), timeout=300, check_rc=0)
    record = record_of(project, "term")
    stopped = [e for e in read_jsonl(record.events_path) if e["kind"] == "stopped"]
    assert [(e["attempt"], e["step"]) for e in stopped] == [(1, 3)]
    first = record.read_json("attempts/1/exit.json")
    assert first["class"] == "preempted" and first["work"]["steps_lost"] == 0, first
    commits = [e["shard"] for e in read_jsonl(record.events_path) if e["kind"] == "shard_commit"]
    assert commits == list(range(ITEMS // SHARD))
    assert_exactly_once(project.root / "term-out")


API_MISUSE = """
import json, sys
import acceptrun
from acceptrun.inference import BatchJob
from acceptrun.spec.model import InferenceSpec

run = acceptrun.init(name="misuse")
job = BatchJob(run, InferenceSpec(input="items.txt", output="out", shard_size=4))
found = {}
shards = job.shards()
shard = next(shards)
for name, call in {
    "count": lambda: shard.commit(["a", "b"]),
    "json": lambda: shard.commit([object()] * 4),
    "unknown id": lambda: shard.fail(99, "x"),
}.items():
    try:
        call()
    except Exception as exc:
        found[name] = f"{type(exc).__name__}: {exc}"
try:
    next(shards)  # shard 0 handed out, never committed
except Exception as exc:
    found["uncommitted"] = f"{type(exc).__name__}: {exc}"
shard2 = BatchJob(run, InferenceSpec(input="items.txt", output="out2", shard_size=4))
s = next(shard2.shards())
s.fail(s.items[1], KeyError("k"))
s.commit({0: "x", 2: "y", 3: "z"})
found["by id"] = open("out2/shard-00000.jsonl").read()
print(json.dumps(found))
"""


def test_api_misuse_is_named_and_outputs_by_id_skip_failed(project: Project) -> None:
    """A standalone run (no supervisor): wrong counts, non-JSON outputs, a skipped commit."""
    write_input(project.root, 8)
    (project.root / "misuse.py").write_text(API_MISUSE)
    proc = subprocess.run(
        [PYTHON, "misuse.py"], cwd=project.root, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["count"].startswith("ValueError: shard 0: 2 outputs for 4 items (0 failed)")
    assert found["json"].startswith("UserError: the output of item 0 is not JSON")
    assert found["unknown id"] == "ValueError: shard 0 has no item with id 99"
    assert found["uncommitted"].startswith("UserError: shard 0 was handed out but not committed")
    lines = [json.loads(line) for line in found["by id"].splitlines()]
    assert [row["id"] for row in lines] == [0, 2, 3]
