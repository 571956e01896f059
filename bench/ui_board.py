"""The board (``acceptrun ui``) with 10,000 runs, and a live feed at 100 steps/s.

1. Fills a fresh workspace with ``--runs`` synthetic records through the workspace API
   (``Workspace.create_run``: run.json, the frozen spec, the index row), each with a
   verdict.json (a third rejected, with failing checks) and a priced ledger.json, then
   times the runs page served by a real board server on 127.0.0.1 (HTTP over loopback,
   the page rendered whole): the first page, a name filter, the rejected ones, and a page
   deep in the list. Median and p90 over ``--repeats``.
2. A live run whose "workload" (a thread of this process, writing step events the way
   the client does: ``RunRecord.event("step", defer=True)``, held at most 0.2 s) logs
   ``--rate`` steps per second for ``--seconds``; one SSE client follows the run's feed.
   Prints steps written and delivered, events/s each way, and the lag from each step's
   timestamp to its arrival at the client (the client's 0.2 s hold included).

    python bench/ui_board.py [--runs 10000] [--repeats 30] [--rate 100] [--seconds 10] [--dir D]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from acceptrun.record.workspace import Workspace, new_run_id
from acceptrun.ui import Board, make_server

SPEC = 'name = "{name}"\ncommand = ["python", "train.py"]\n'
NAMES = ("bert-squad", "charlm", "resnet50", "llama-ft", "whisper-small")


def fill(ws: Workspace, runs: int) -> float:
    """``runs`` closed runs, one per simulated minute; returns the seconds it took."""
    t0 = time.perf_counter()
    base = time.time() - runs * 60.0
    for i in range(runs):
        name = NAMES[i % len(NAMES)]
        rejected = i % 3 == 0
        verdict = "rejected" if rejected else "accepted"
        record = ws.create_run(
            name,
            spec_text=SPEC.format(name=name),
            run_id=new_run_id(name, base + 60.0 * i),
            state={"status": "finished", "verdict": verdict, "mode": "supervised",
                   "duration_s": 300.0 + i % 97, "attempts": 1 + (i % 5 == 0)},
        )  # fmt: skip
        checks = [{"name": "exit", "group": "operations", "required": True, "status": "pass",
                   "evidence": "exit 0"}]  # fmt: skip
        if rejected:
            checks.append({"name": "metric eval/f1", "group": "results", "required": True,
                           "status": "fail", "evidence": "eval/f1 = 0.71, needs >= 0.85"})  # fmt: skip
        record.write_json("verdict.json", {"accepted": not rejected, "checks": checks})
        record.write_json("ledger.json", {"priced": True, "total_usd": 1.25 + (i % 7) * 0.5})
    return time.perf_counter() - t0


TOKEN = "bench-token-0123456789"
# Every page needs the board's token, on loopback too (docs/ui.md): a script sends it as
# a bearer token, as a browser sends the cookie.
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def get(port: int, path: str) -> tuple[int, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", path, headers={"Host": f"127.0.0.1:{port}", **AUTH})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, len(body)


def time_pages(port: int, repeats: int, pages: int) -> None:
    cases = [
        ("runs page 1", "/"),
        ("name filter", "/?name=resnet"),
        ("rejected only", "/?verdict=rejected"),
        (f"page {max(1, pages // 2)}", f"/?page={max(1, pages // 2)}"),
    ]
    print(f"{'page':<16} {'median ms':>10} {'p90 ms':>8} {'KiB':>6}")
    for label, path in cases:
        status, size = get(port, path)  # warm: the first read of the index
        assert status == 200, (path, status)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            get(port, path)
            times.append(1000 * (time.perf_counter() - t0))
        times.sort()
        p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
        print(f"{label:<16} {statistics.median(times):>10.1f} {p90:>8.1f} {size / 1024:>6.0f}")


def live_feed(ws: Workspace, port: int, rate: float, seconds: float) -> None:
    record = ws.create_run(
        "live",
        spec_text=SPEC.format(name="live"),
        state={"status": "running", "mode": "standalone"},
    )
    record.event("workload_start", pid=os.getpid())  # a standalone run is live while its pid is
    received: list[tuple[int, float, float]] = []  # step, its timestamp, arrival
    ready = threading.Event()

    def follow() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request(
            "GET", f"/run/0/{record.run_id}/stream", headers={"Host": f"127.0.0.1:{port}", **AUTH}
        )
        resp = conn.getresponse()
        ready.set()
        event = ""
        for raw in resp:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "steps":
                now = time.time()
                received.extend((r["step"], r["t"], now) for r in json.loads(line[6:]))
            elif line.startswith("data: ") and event == "end":
                return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    ready.wait(30)
    n = int(rate * seconds)
    t0 = time.perf_counter()
    for i in range(n):
        # As the client logs a step: held up to 0.2 s, then written with the ones after it.
        record.event(
            "step", defer=True, step=i, loss=1.0 / (i + 1), step_time=1.0 / rate, samples=8
        )
        delay = t0 + (i + 1) / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    record.flush_events()
    written_s = time.perf_counter() - t0
    record.update_state(status="finished")
    reader.join(60)
    steps = [s for s, _, _ in received]
    lags = sorted(1000 * (arr - t) for _, t, arr in received)
    print(f"live feed: {n} steps written in {written_s:.1f} s ({n / written_s:.1f}/s); "
          f"{len(steps)} delivered ({len(set(steps))} distinct, in order: {steps == sorted(steps)}), "
          f"{len(steps) / written_s:.1f}/s")  # fmt: skip
    if lags:
        p90 = lags[min(len(lags) - 1, int(0.9 * len(lags)))]
        print(f"lag from a step's timestamp to the client: median {statistics.median(lags):.0f} ms, "
              f"p90 {p90:.0f} ms, max {lags[-1]:.0f} ms (the client's 0.2 s hold included)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--rate", type=float, default=100.0, help="steps per second of the live run")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument(
        "--dir", default="/dev/shm" if Path("/dev/shm").is_dir() else None,
        help="where the workspace goes (default /dev/shm: the fill's fsyncs cost nothing there, "
        "and the bench measures the board, not the disk)",
    )  # fmt: skip
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ui-bench-", dir=args.dir) as tmp:
        os.environ["ACCEPTRUN_CONFIG_DIR"] = str(Path(tmp) / "config")
        ws = Workspace.create(Path(tmp) / "ws")
        took = fill(ws, args.runs)
        print(f"filled {args.runs} runs through the workspace API in {took:.1f} s ({ws.root})")
        server = make_server(Board.for_workspaces([ws]), "127.0.0.1", 0, TOKEN)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            time_pages(server.port, args.repeats, max(1, args.runs // 50))
            live_feed(ws, server.port, args.rate, args.seconds)
        finally:
            server.shutdown()
            server.server_close()
    print(f"load average {os.getloadavg()[0]:.2f} (2 cores shared)")


if __name__ == "__main__":
    main()
