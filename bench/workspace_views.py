"""Workspace-wide views over 10,000 closed runs: ``acceptrun cost``, the spend page, ``ls``.

1. Builds a fresh workspace of ``--runs`` closed runs, fast: four template runs are
   recorded through the workspace API (``Workspace.create_run``, ``RunRecord.event``:
   a clean run, one preempted and resumed, one that ran out of memory, one unpriced) and
   their ledgers built by :func:`acceptrun.cost.ledger.build_ledger`; each run of the
   workspace is a copy of one of them (the frozen spec, events.jsonl, run.json), its
   ledger.json that template's with the run's id, name, time and verdict, each file as
   the record's writer lays it out (pretty, key-sorted JSON) but without its fsync and
   redaction, which would make the 10,000 copies take minutes. Then ``acceptrun index
   rebuild`` (:meth:`Workspace.rebuild_index`) indexes them, as an upgrade would.
2. Times, as real processes (interpreter start-up included, what a user waits for):
   ``acceptrun cost``, ``acceptrun cost --json``, ``acceptrun ls`` and, for the
   start-up alone, ``acceptrun --version``; for reference, ``acceptrun cost
   --by-responsibility --json`` (every run's waste, a row each: megabytes of JSON,
   every byte through the terminal's redactor); the board's spend page as served by a
   real board server on 127.0.0.1 (HTTP over loopback); and, in this process, what
   ``cost`` and the spend page do once started. Each figure is the median of
   ``--repeats``, after one warm-up (the first read of a freshly rebuilt index is no
   different, it is left out only to keep the disk cache out of the figure). The
   warm-up also does what an installed acceptrun has done before: its modules' bytecode
   is written (PYTHONDONTWRITEBYTECODE is dropped for the children) and the
   secret-shape rules' cache (acceptrun._util.secret_shapes.cache_path) is filled.
3. Checks that ``acceptrun cost --json`` totals equal the ledgers' own sums.

    python bench/workspace_views.py [--runs 10000] [--repeats 5] [--dir D]

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from acceptrun.cost.ledger import build_ledger, ledger_inputs
from acceptrun.record.workspace import RunRecord, Workspace, new_run_id, now_iso

PRICED = 'name = "{name}"\ncommand = ["python", "train.py"]\n[cost]\nprice_per_hour = 3.78\n'
UNPRICED = 'name = "{name}"\ncommand = ["python", "train.py"]\n'
NAMES = ("bert-squad", "charlm", "resnet50", "llama-ft", "whisper-small")
TOKEN = "bench-token-0123456789"


def _template(ws: Workspace, kind: str) -> tuple[str, str, dict[str, Any]]:
    """A recorded run of ``kind``: (spec text, events.jsonl text, its ledger)."""
    spec = (UNPRICED if kind == "unpriced" else PRICED).format(name=kind)
    rec = ws.create_run(kind, spec_text=spec, state={"status": "closing"})
    t0 = time.time() - 3600.0
    rec.event("run_start", t=t0)
    n = 1
    if kind in ("preempted", "oom"):
        klass = "preempted" if kind == "preempted" else "cuda_oom"
        rec.event("attempt_start", t=t0 + 5, attempt=1)
        rec.event(
            "attempt_exit", t=t0 + 600, attempt=1, outcome="failed", returncode=1,
            signal=None, started_at=now_iso(t0 + 5), ended_at=now_iso(t0 + 600),
            reason=f"it was {klass}", work={"seconds_lost": 240.0}, decision=None,
            **{"class": klass, "class_reason": f"it was {klass}", "evidence": [klass]},
        )  # fmt: skip
        n = 2
    rec.event("attempt_start", t=t0 + 620, attempt=n)
    rec.event(
        "attempt_exit", t=t0 + 1800, attempt=n, outcome="success", returncode=0, signal=None,
        reason="exited 0", work={}, decision=None, **{"class": "success", "evidence": []},
    )  # fmt: skip
    rec.update_state(status="finished", verdict="rejected" if kind == "oom" else "accepted")
    rec.flush_events()
    return spec, rec.events_path.read_text(), build_ledger(rec)


def _write_json(path: Path, obj: Any) -> None:
    """As :func:`acceptrun._util.durable.write_json_atomic` lays it out, without the fsync."""
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def fill(ws: Workspace, runs: int) -> dict[str, float]:
    """``runs`` closed runs, one per simulated ten minutes; seconds to write and to index."""
    t0 = time.perf_counter()
    templates = [_template(ws, k) for k in ("clean", "preempted", "oom", "unpriced")]
    base = time.time() - runs * 600.0
    for i in range(runs):
        name = NAMES[i % len(NAMES)]
        spec, events, ledger = templates[i % 7 % len(templates)]
        t = base + 600.0 * i
        run_id = new_run_id(name, t)
        record = RunRecord(ws.runs_dir / run_id)
        record.path.mkdir()
        accepted = ledger["accepted"] if i % 11 else False
        (record.path / "spec.toml").write_text(spec.replace('"clean"', f'"{name}"'))
        record.events_path.write_text(events)
        state = {"run_id": run_id, "name": name, "created_at": now_iso(t),
                 "status": "finished", "verdict": "accepted" if accepted else "rejected",
                 "mode": "supervised", "attempts": 1 + (i % 7 in (1, 2)),
                 "duration_s": 1800.0, "ended_at": now_iso(t + 1800)}  # fmt: skip
        _write_json(record.file("run.json"), state)
        _write_json(
            record.file("ledger.json"),
            {**ledger, "run_id": run_id, "name": name, "created_at": state["created_at"],
             "accepted": accepted, "inputs": ledger_inputs(record)},
        )  # fmt: skip
    written = time.perf_counter() - t0
    t1 = time.perf_counter()
    ws.rebuild_index()
    return {"write_s": round(written, 1), "index_rebuild_s": round(time.perf_counter() - t1, 2)}


def timed_process(argv: list[str], repeats: int, env: dict[str, str]) -> tuple[float, str]:
    """Median seconds of ``acceptrun ARGV`` as a process, and its last output; the median
    CPU seconds (user and system) go to CPU[argv's last word], for a loaded machine."""
    cmd = [sys.executable, "-m", "acceptrun", *argv]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    times, cpu = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        times.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    CPU[" ".join(argv[2:]) or argv[0]] = statistics.median(cpu)
    return statistics.median(times), out


CPU: dict[str, float] = {}  # CPU seconds of each timed command, by its words after --workspace


def time_spend_page(ws: Workspace, repeats: int) -> float:
    """Median seconds for GET /spend from a real board server on loopback."""
    from acceptrun.ui import Board, make_server

    server = make_server(Board.for_workspaces([ws]), "127.0.0.1", 0, token=TOKEN)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    headers = {"Host": f"127.0.0.1:{port}", "Authorization": f"Bearer {TOKEN}"}

    def get() -> float:
        t0, c0 = time.perf_counter(), time.process_time()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("GET", "/spend", headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        assert resp.status == 200 and b"cost per accepted run" in body, resp.status
        cpu.append(time.process_time() - c0)  # the server's thread and this client's
        return time.perf_counter() - t0

    cpu: list[float] = []
    try:
        get()
        cpu.clear()
        wall = statistics.median(get() for _ in range(repeats))
        CPU["spend page"] = statistics.median(cpu)
        return wall
    finally:
        server.shutdown()
        server.server_close()


def in_process(ws: Workspace, repeats: int) -> tuple[float, float]:
    """Median seconds of what ``cost`` and the spend page do once started (no start-up)."""
    from acceptrun.cost.catalog import load_catalog
    from acceptrun.cost.report import format_summary, select_ledgers, summarize
    from acceptrun.ui import Board
    from acceptrun.ui.spend import spend_page

    def cost() -> float:
        t0 = time.perf_counter()
        ledgers, live = select_ledgers(ws, load_catalog(ws.root), figures=False)
        format_summary(summarize(ledgers), live=live)
        return time.perf_counter() - t0

    def spend() -> float:
        t0 = time.perf_counter()
        spend_page(Board.for_workspaces([ws]))
        return time.perf_counter() - t0

    return (
        statistics.median(cost() for _ in range(repeats)),
        statistics.median(spend() for _ in range(repeats)),
    )


def sums(ws: Workspace) -> dict[str, float]:
    """The totals of every ledger.json in the workspace, added up here."""
    total = accepted = runs = 0.0
    for rid in ws.run_ids():
        ledger = json.loads((ws.runs_dir / rid / "ledger.json").read_text())
        runs += 1
        total += ledger["total_usd"]
        accepted += ledger["accepted"] is True
    return {"runs": runs, "accepted": accepted, "total_usd": round(total, 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dir", type=Path, default=None, help="where to build the workspace")
    args = p.parse_args()
    if args.runs < 1 or args.repeats < 1:
        p.error(f"--runs {args.runs} and --repeats {args.repeats}: each must be 1 or more")
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)  # the workspace is built under it
    root = Path(tempfile.mkdtemp(prefix="acceptrun-views-", dir=args.dir))
    ws = Workspace.create(root / ".acceptrun")
    built = fill(ws, args.runs)
    runs = len(ws.run_ids())
    print(f"workspace: {runs} closed runs in {ws.root}")
    print(
        f"  written in {built['write_s']} s, `acceptrun index rebuild` {built['index_rebuild_s']} s"
    )
    env = {**os.environ, "ACCEPTRUN_WORKSPACE": str(ws.root)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed acceptrun has its bytecode
    figures: dict[str, Any] = {"runs": runs, "cpus": os.cpu_count(), **built}
    cost_s, _ = timed_process(["--workspace", str(ws.root), "cost"], args.repeats, env)
    json_s, text = timed_process(["--workspace", str(ws.root), "cost", "--json"], args.repeats, env)
    split = ["--workspace", str(ws.root), "cost", "--by-responsibility", "--json"]
    split_s, _ = timed_process(split, args.repeats, env)
    ls_s, _ = timed_process(["--workspace", str(ws.root), "ls"], args.repeats, env)
    start_s, _ = timed_process(["--version"], args.repeats, env)
    spend_s = time_spend_page(ws, args.repeats)
    cost_in, spend_in = in_process(ws, args.repeats)
    got = json.loads(text)
    want = sums(ws)
    same = (got["runs"], got["accepted"], round(got["total_usd"], 4)) == (
        want["runs"], want["accepted"], want["total_usd"],
    )  # fmt: skip
    figures.update(cost_s=round(cost_s, 3), cost_json_s=round(json_s, 3),
                   spend_page_s=round(spend_s, 3), ls_s=round(ls_s, 3),
                   cost_by_responsibility_json_s=round(split_s, 3),
                   version_s=round(start_s, 3), cost_in_process_s=round(cost_in, 3),
                   spend_in_process_s=round(spend_in, 3),
                   totals_match_ledgers=same, total_usd=want["total_usd"])  # fmt: skip
    figures["cpu_s"] = {k: round(v, 3) for k, v in CPU.items()}
    print(f"  acceptrun cost          {cost_s:.3f} s (median of {args.repeats}, a process; "
          f"CPU {CPU['cost']:.3f} s)")  # fmt: skip
    print(f"  acceptrun cost --json   {json_s:.3f} s (CPU {CPU['cost --json']:.3f} s)")
    print(f"  board spend page        {spend_s:.3f} s (GET /spend over loopback; "
          f"CPU {CPU['spend page']:.3f} s)")  # fmt: skip
    print(f"  acceptrun ls            {ls_s:.3f} s (for reference)")
    print(f"  cost --by-responsibility --json {split_s:.3f} s (every run's row, for reference)")
    print(f"  acceptrun --version     {start_s:.3f} s (start-up alone, for reference; "
          f"CPU {CPU['--version']:.3f} s)")  # fmt: skip
    print(f"  in one process: cost {cost_in:.3f} s, spend page {spend_in:.3f} s (no start-up)")
    print(f"  totals equal the ledgers' own sums: {same} (${want['total_usd']:,.2f})")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
