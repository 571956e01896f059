"""The load generator's own limits, measured on this machine, beside wrk.

    .venv/bin/python bench/serving_load.py [--seconds 4] [--connections 16]

Against a trivial HTTP server on loopback (standard library asyncio, a separate process,
a fixed 2-byte JSON answer, keep-alive) with the same POST payload for both tools:

1. ceiling: the requests/s acceptrun's generator drives with N clients (closed loop), and
   wrk with N connections (wrk -t2 -cN), over the same seconds;
2. latency added: one client, one request at a time: acceptrun's p50/p99 vs wrk's (wrk
   is C; the difference is what the Python generator adds per request); and the
   open-loop send lag (actual minus intended send time) at a modest rate;
3. a stalling server (answers nothing for 1 s every 3 s): acceptrun's open-loop p99,
   timed from the intended send, sees the stall; closed-loop latencies as measured
   (acceptrun's closed mode) hide it, because the clients send almost nothing while the
   server stalls (coordinated omission). wrk 4 is closed-loop too, but before printing it
   corrects its histogram after the fact (stats_correct: synthetic samples at the mean
   interval per connection), so its p99 shows an estimate of the stall; wrk2 instead
   sends on a schedule, as acceptrun's open loop does.

Loopback addresses only, bounded loops. wrk is skipped with a clear line when missing
(Debian package wrk: `make` installs it with the other system packages).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from acceptrun.serving.load import LoadPlan, run_load
from acceptrun.serving.summary import percentile

BODY = b'{"prompt": "hello", "max_tokens": 1}'
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


# ---- the trivial server (a child process: it must not share the generator's GIL) -----------


def serve(port: int, stall_every: float, stall: float) -> None:
    t0 = time.monotonic()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                m = re.search(rb"(?i)content-length:\s*(\d+)", head)
                if m:
                    await reader.readexactly(int(m.group(1)))
                if stall_every > 0:
                    phase = (time.monotonic() - t0) % stall_every
                    if phase >= stall_every - stall:
                        await asyncio.sleep(stall_every - phase)
                writer.write(ANSWER)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
        print("ready", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


class Server:
    def __init__(self, *, stall_every: float = 0.0, stall: float = 0.0) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(self.port), "--stall-every",
             str(stall_every), "--stall", str(stall)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"
        self.url = f"http://127.0.0.1:{self.port}/v1/completions"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# ---- the two tools -------------------------------------------------------------------------


def acceptrun_load(url: str, **plan: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    results = run_load(LoadPlan(url=url, bodies=[BODY], **plan))
    wall = time.perf_counter() - t0
    ok = [r for r in results if r.ok and r.latency is not None]
    lat = [r.latency for r in ok if r.latency is not None]
    lag = [r.sent - r.intended for r in results if r.sent is not None]
    return {
        "requests": len(results),
        "ok": len(ok),
        "rps": round(len(ok) / wall, 1),
        "p50_ms": _ms(percentile(lat, 50)),
        "p99_ms": _ms(percentile(lat, 99)),
        "max_ms": _ms(max(lat) if lat else None),
        "send_lag_p50_ms": _ms(percentile(lag, 50)),
        "send_lag_p99_ms": _ms(percentile(lag, 99)),
    }


WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
"""


def wrk_load(url: str, *, connections: int, threads: int, seconds: float) -> dict[str, Any] | str:
    wrk = shutil.which("wrk")
    if wrk is None:
        return "wrk: not installed (Debian package wrk; `apt-get install wrk`), skipped"
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(WRK_SCRIPT % BODY.decode())
    proc = subprocess.run(
        [wrk, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency",
         "-s", f.name, url],
        capture_output=True, text=True, timeout=seconds + 30, check=False,
    )  # fmt: skip
    Path(f.name).unlink()
    out = proc.stdout
    rps = re.search(r"Requests/sec:\s*([\d.]+)", out)
    p50 = re.search(r"^\s*50%\s+([\d.]+)(us|ms|s)", out, re.M)
    p99 = re.search(r"^\s*99%\s+([\d.]+)(us|ms|s)", out, re.M)
    mx = re.search(r"Latency\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", out)
    return {
        "rps": float(rps.group(1)) if rps else None,
        "p50_ms": _unit(p50),
        "p99_ms": _unit(p99),
        "max_ms": _unit(mx),
    }


def _unit(m: re.Match[str] | None) -> float | None:
    if m is None:
        return None
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
    return round(float(m.group(1)) * scale, 3)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each measurement")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--stall-every", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--stall", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.stall_every, args.stall)
        return
    secs, conns = args.seconds, args.connections
    out: dict[str, Any] = {"machine_cpus": _cpus(), "seconds": secs, "connections": conns}

    server = Server()
    try:
        out["ceiling"] = {
            "acceptrun_closed": acceptrun_load(server.url, concurrency=conns, duration=secs),
            "wrk": wrk_load(server.url, connections=conns, threads=2, seconds=secs),
        }
        out["one_at_a_time"] = {
            "acceptrun_closed_c1": acceptrun_load(server.url, concurrency=1, duration=secs),
            "wrk_c1": wrk_load(server.url, connections=1, threads=1, seconds=secs),
        }
        for rate in (200, 500):
            out[f"open_loop_{rate}_per_s"] = acceptrun_load(server.url, rate=rate, duration=secs)
    finally:
        server.close()

    stall_secs = max(secs, 9.0)  # three stall cycles at least
    stalling = Server(stall_every=3.0, stall=1.0)
    try:
        out["stalling_server_1s_every_3s"] = {
            "acceptrun_open_100_per_s": acceptrun_load(stalling.url, rate=100, duration=stall_secs),
            "acceptrun_closed_c4": acceptrun_load(stalling.url, concurrency=4, duration=stall_secs),
            "wrk_c4": wrk_load(stalling.url, connections=4, threads=2, seconds=stall_secs),
        }
    finally:
        stalling.close()
    for key, value in out.items():
        print(f"{key}: {json.dumps(value)}")


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    main()
