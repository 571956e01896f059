"""Batch inference: a kill campaign, and what a shard commit costs per item.

    python bench/batch_inference.py                  # 50 kills, then the overhead
    python bench/batch_inference.py --kills 100 --reps 7

(a) Kill campaign. A batch run (``acceptrun run``, a labelling workload over a text
file, shards of 20 items of about 1 ms each) runs once uninterrupted, then again while
this script SIGKILLs its workload ``--kills`` times: each attempt is killed at a random
moment after its first shard commit (within two shards' time, so kills land in the
model loop, in the outputs write, between the outputs file and the manifest, and in the
events), and the supervisor restarts it. Afterwards every output line is read back:
"lost" counts input items without an output, "duplicated" items with more than one,
and the concatenated shards are compared byte for byte with the uninterrupted run.
"torn" counts kills that left an outputs file or a temporary without its manifest (a
half-written shard, which must be redone and never counted).

(b) Overhead. In one process (a standalone run), the same input is read, cut into
shards, run through a trivial "model" (so that the bookkeeping is all there is to see)
and written three ways, ``--reps`` times each, interleaved: directly (json lines and one
plain write per shard, no guarantees), directly with an fsync per shard, and through
``run.inference`` / ``shard.commit`` (the committed check, an atomic outputs file
with its fsyncs, the hash, the manifest in the record, the events). The
figure is the added time per item over the plain write (and over write+fsync), min,
median and max over the repetitions, with the load average (the machine is shared).

Prints two JSON lines and a summary line each. Exit status 1 when an item was lost or
duplicated, or the outputs differ.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

PYTHON = sys.executable

WORKLOAD = """
import hashlib, os, time
import acceptrun

delay = float(os.environ.get("ITEM_DELAY", "0"))
run = acceptrun.init()
for shard in run.inference.shards():
    outputs = []
    for item in shard.items:
        time.sleep(delay)
        outputs.append({"label": hashlib.sha256(item.value.encode()).hexdigest()[:8]})
    shard.commit(outputs, tokens=sum(len(v.split()) for v in shard.values))
"""


def _spec(root: Path, name: str, output: str, *, restarts: int, delay: float, shard: int) -> Path:
    text = f"""
    name = "{name}"
    command = ["{PYTHON}", "work.py"]
    env = {{ ITEM_DELAY = "{delay}" }}
    [inference]
    input = "items.txt"
    output = "{output}"
    shard_size = {shard}
    [limits]
    max_restarts = {restarts}
    restart_backoff = 0  # no backoff: 50 restarts would otherwise double to minutes each
    """
    path = root / f"{name}.toml"
    path.write_text(textwrap.dedent(text))
    return path


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out


def _run_dir(workspace: Path, name: str) -> Path | None:
    runs = workspace / "runs"
    found = (
        []
        if not runs.is_dir()
        else sorted(p for p in runs.glob(f"*-{name}-*") if not p.name.startswith("."))
    )  # a record is assembled under a hidden temporary name, then renamed: skip those
    return found[0] if found and (found[0] / "run.json").exists() else None


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.005)


def _torn(out_dir: Path, run_dir: Path) -> bool:
    """An outputs file or a temporary without a manifest: a shard killed mid-commit."""
    manifests = {p.stem for p in (run_dir / "inference" / "shards").glob("shard-*.json")}
    files = {p.stem for p in out_dir.glob("shard-*.jsonl")}
    temps = list(out_dir.glob(".shard-*")) + list(
        (run_dir / "inference" / "shards").glob(".shard-*")
    )
    return bool(files - manifests) or bool(temps)


def kill_campaign(root: Path, kills: int, items: int, shard: int, seed: int) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "work.py").write_text(WORKLOAD)
    (root / "items.txt").write_text(
        "".join(f"item {i}: the quick brown fox jumps over dog {i % 97}\n" for i in range(items))
    )
    workspace = root / ".acceptrun"
    env = {**os.environ, "ACCEPTRUN_WORKSPACE": str(workspace)}
    env.pop("ACCEPTRUN_INJECT", None)
    cli = [PYTHON, "-m", "acceptrun", "run"]
    ref = _spec(root, "ref", "ref-out", restarts=0, delay=0.001, shard=shard)
    t0 = time.perf_counter()
    subprocess.run([*cli, str(ref)], cwd=root, env=env, check=True, capture_output=True)
    ref_s = time.perf_counter() - t0

    spec = _spec(root, "killed", "killed-out", restarts=kills + 5, delay=0.001, shard=shard)
    rng = random.Random(seed)
    log = open(root / "killed.log", "w")  # noqa: SIM115 - the run's output, closed below
    t0 = time.perf_counter()
    proc = subprocess.Popen([*cli, str(spec)], cwd=root, env=env, stdout=log, stderr=log)
    torn = 0
    try:
        run_dir = _wait(lambda: _run_dir(workspace, "killed"), 300, "the run record")
        for attempt in range(1, kills + 1):

            def first_commit(attempt: int = attempt) -> int | None:
                evs = _events(run_dir)
                start = [
                    e for e in evs if e["kind"] == "workload_start" and e["attempt"] == attempt
                ]
                done = any(e["kind"] == "shard_commit" and e["attempt"] == attempt for e in evs)
                return start[0]["pid"] if start and done else None

            pid = _wait(first_commit, 300, f"attempt {attempt}'s first shard commit")
            time.sleep(rng.uniform(0, 2 * shard * 0.0012))  # within about two shards
            os.kill(pid, signal.SIGKILL)
            _wait(
                lambda a=attempt: any(
                    e["kind"] == "attempt_exit" and e["attempt"] == a for e in _events(run_dir)
                ),
                300,
                f"attempt {attempt}'s exit",
            )
            torn += _torn(root / "killed-out", run_dir)
        rc = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    killed_s = time.perf_counter() - t0

    def read(out: Path) -> tuple[bytes, Counter[int]]:
        body = b"".join(p.read_bytes() for p in sorted(out.glob("shard-*.jsonl")))
        return body, Counter(json.loads(line)["id"] for line in body.splitlines())

    ref_body, _ = read(root / "ref-out")
    body, ids = read(root / "killed-out")
    lost = sum(1 for i in range(items) if ids[i] == 0)
    duplicated = sum(1 for i in range(items) if ids[i] > 1)
    summary = json.loads((run_dir / "inference.json").read_text())
    attempts = sum(1 for e in _events(run_dir) if e["kind"] == "attempt_start")
    return {
        "bench": "kill_campaign",
        "kills": kills,
        "attempts": attempts,
        "items": items,
        "shard_size": shard,
        "lost": lost,
        "duplicated": duplicated,
        "byte_identical": body == ref_body,
        "torn_shards_redone": torn,
        "coverage": summary.get("coverage"),
        "verdict_rc": rc,
        "reference_s": round(ref_s, 1),
        "killed_run_s": round(killed_s, 1),
        "root": str(root),
    }


# ---- (b) overhead ------------------------------------------------------------------------------

OVERHEAD_WORKER = """
import json, os, sys, time
from pathlib import Path
import acceptrun
from acceptrun.workload.batch import BatchJob, encode_output
from acceptrun.workload.items import iter_shards
from acceptrun.spec.model import InferenceSpec

root, reps, shard_size = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
source = str(root / "items.txt")
run = acceptrun.init(name="overhead")
shards = list(iter_shards(source, shard_size))
items = sum(len(s.items) for s in shards)

def model(values):
    return [v.upper() for v in values]

def direct(out, sync):
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    for s in iter_shards(source, shard_size):  # read and parsed here too, as commit's path does
        outputs = model([i.value for i in s.items])
        body = b"".join(encode_output(i.id, o) for i, o in zip(s.items, outputs))
        with open(out / f"shard-{s.index:05d}.jsonl", "wb") as f:
            f.write(body)
            if sync:
                f.flush()
                os.fsync(f.fileno())
    return time.perf_counter() - t0

def committed(out, r):
    job = BatchJob(run, InferenceSpec(input=source, output=str(out), shard_size=shard_size))
    job.manifests = run.run_dir / "inference" / f"bench-{r}"  # each repetition commits afresh
    t0 = time.perf_counter()
    for shard in job.shards():
        shard.commit(model(shard.values))
    return time.perf_counter() - t0

rows = []
for r in range(reps):
    rows.append({
        "direct": direct(root / f"direct-{r}", False),
        "fsync": direct(root / f"fsync-{r}", True),
        "commit": committed(root / f"commit-{r}", r),
    })
print(json.dumps({"items": items, "shards": len(shards), "rows": rows}))
"""


def overhead(root: Path, reps: int, items: int, shard: int) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "items.txt").write_text(
        "".join(f"item {i}: the quick brown fox jumps over dog {i % 97}\n" for i in range(items))
    )
    (root / "worker.py").write_text(OVERHEAD_WORKER)
    env = {**os.environ, "ACCEPTRUN_WORKSPACE": str(root / ".acceptrun")}
    for k in [k for k in env if k.startswith("ACCEPTRUN_") and k != "ACCEPTRUN_WORKSPACE"]:
        env.pop(k)
    load_before = os.getloadavg()
    proc = subprocess.run(
        [PYTHON, "worker.py", str(root), str(reps), str(shard)],
        cwd=root, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    load_after = os.getloadavg()
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    n = data["items"]

    def per_item_us(key: str, base: str) -> dict[str, float]:
        diffs = [1e6 * (row[key] - row[base]) / n for row in data["rows"]]
        return {
            "min": round(min(diffs), 2),
            "median": round(statistics.median(diffs), 2),
            "max": round(max(diffs), 2),
        }

    def per_item(key: str) -> float:
        return round(1e6 * statistics.median(row[key] for row in data["rows"]) / n, 2)

    return {
        "bench": "commit_overhead",
        "items": n,
        "shards": data["shards"],
        "shard_size": shard,
        "reps": reps,
        "us_per_item_direct": per_item("direct"),
        "us_per_item_direct_fsync": per_item("fsync"),
        "us_per_item_commit": per_item("commit"),
        "added_us_per_item_vs_direct": per_item_us("commit", "direct"),
        "added_us_per_item_vs_fsync": per_item_us("commit", "fsync"),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50, help="SIGKILLs of the workload (50)")
    parser.add_argument("--items", type=int, default=4000, help="input items of the campaign")
    parser.add_argument("--shard-size", type=int, default=20, help="items per shard (20)")
    parser.add_argument("--reps", type=int, default=5, help="overhead repetitions (5)")
    parser.add_argument("--overhead-items", type=int, default=20000)
    parser.add_argument("--overhead-shard-size", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill moments")
    parser.add_argument("--root", type=Path, help="work directory (default: a new temp dir)")
    parser.add_argument("--skip-kills", action="store_true", help="only the overhead part")
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="batch-bench-"))
    ok = True
    if not args.skip_kills:
        a = kill_campaign(root / "kills", args.kills, args.items, args.shard_size, args.seed)
        print(json.dumps(a), flush=True)
        print(
            f"kill campaign: {a['kills']} kills, lost: {a['lost']}, duplicated: "
            f"{a['duplicated']}, byte-identical: {str(a['byte_identical']).lower()}, "
            f"torn shards redone: {a['torn_shards_redone']}",
            flush=True,
        )
        ok = a["lost"] == 0 and a["duplicated"] == 0 and a["byte_identical"]
    b = overhead(root / "overhead", args.reps, args.overhead_items, args.overhead_shard_size)
    print(json.dumps(b), flush=True)
    d, f = b["added_us_per_item_vs_direct"], b["added_us_per_item_vs_fsync"]
    print(
        f"shard commit overhead per item: +{d['median']} us over a plain write "
        f"(min {d['min']}, max {d['max']}), +{f['median']} us over write+fsync "
        f"(min {f['min']}, max {f['max']}); shards of {b['shard_size']}; "
        f"load average {b['load_before'][0]} -> {b['load_after'][0]}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
