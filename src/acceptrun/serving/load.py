"""acceptrun's load generator: open-loop (Poisson) or closed-loop HTTP load, and its bodies.

Open loop (``rate``): the send times are drawn before the load starts (exponential gaps
for Poisson arrivals, as MLPerf Inference's Server scenario; even gaps for "uniform") and
every request is sent at its time whether or not earlier ones have answered. Latency is
measured from the **intended** send time, so a server that stalls is charged for the
requests that queued behind the stall (no coordinated omission, the wrk2 approach).

Closed loop (``concurrency``): N clients each send the next request when the last one
answered; latency is measured from the actual send (what closed-loop tools report).

HTTP/1.1 over asyncio streams (no HTTP package), keep-alive connections reused from an
idle pool, bodies read by Content-Length, chunked encoding or until close. With ``stream``
the body is read as server-sent events: each ``data:`` event other than ``[DONE]`` is one
token, which gives the time to first token (TTFT) and the inter-token latencies (ITL).

>>> plan = LoadPlan(url="http://127.0.0.1:8000/", rate=50.0, requests=100)
>>> results = run_load(plan)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import json
import random
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.durable import loads_json

__all__ = ["LoadPlan", "RequestResult", "arrival_schedule", "load_bodies", "run_load"]

MAX_CONNECTIONS = 512  # open loop: requests beyond this wait for a connection (still timed)
READ_CHUNK = 65536  # bytes


def load_bodies(path: str | None) -> list[bytes]:
    """Request bodies from a JSONL file (each line re-serialised compactly); [b""] without one."""
    if path is None:
        return [b""]
    bodies = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            bodies.append(json.dumps(loads_json(line), separators=(",", ":")).encode())
        except ValueError as exc:  # not JSON, or nested too deep
            raise ValueError(f"{path}:{n}: not JSON ({exc}); one request body a line") from None
    if not bodies:
        raise ValueError(f"{path}: no request body; write one JSON value a line")
    return bodies


@dataclass(kw_only=True)
class LoadPlan:
    """What to send, how often and for how long."""

    url: str
    method: str = "POST"
    bodies: list[bytes] = field(default_factory=lambda: [b""])
    headers: dict[str, str] = field(default_factory=dict)
    rate: float | None = None  # open loop, requests per second
    arrivals: str = "poisson"
    concurrency: int | None = None  # closed loop, clients
    duration: float | None = None  # seconds
    requests: int | None = None
    stream: bool = False
    timeout: float = 30.0  # seconds per request
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError("a load plan needs exactly one of rate and concurrency")
        if self.duration is None and self.requests is None:
            raise ValueError("a load plan needs a duration, a request count or both")
        if not self.bodies:
            self.bodies = [b""]


@dataclass(slots=True)
class RequestResult:
    """One request: times in seconds from the start of the load."""

    index: int
    intended: float  # when it was meant to be sent (open loop) or was sent (closed loop)
    sent: float | None = None  # when its first byte was written
    end: float | None = None  # when its answer was complete, or it failed
    status: int | None = None
    bytes_in: int = 0
    ttft: float | None = None  # first token (stream) or first body byte, from intended
    token_times: list[float] = field(default_factory=list)  # stream: each data event's time
    error: str | None = None

    @property
    def latency(self) -> float | None:
        return None if self.end is None else self.end - self.intended

    @property
    def ok(self) -> bool:
        return self.error is None and self.status is not None and self.status < 400

    def to_dict(self) -> dict[str, Any]:
        itl = [
            round(b - a, 6) for a, b in zip(self.token_times, self.token_times[1:], strict=False)
        ]
        return {
            "i": self.index,
            "t": round(self.intended, 6),
            "wait": None if self.sent is None else round(self.sent - self.intended, 6),
            "latency": None if self.latency is None else round(self.latency, 6),
            "status": self.status,
            "bytes": self.bytes_in,
            "ttft": None if self.ttft is None else round(self.ttft, 6),
            "tokens": len(self.token_times),
            "itl": itl,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestResult:
        """A result back from its :meth:`to_dict` line (times to the microsecond it keeps)."""
        t = float(d["t"])
        latency, wait, ttft = d.get("latency"), d.get("wait"), d.get("ttft")
        tokens = int(d.get("tokens") or 0)
        token_times: list[float] = []
        if tokens and ttft is not None:  # the first token at ttft, the rest by their gaps
            token_times.append(t + float(ttft))
            for gap in (d.get("itl") or [])[: tokens - 1]:
                token_times.append(token_times[-1] + float(gap))
        return cls(
            index=int(d.get("i") or 0), intended=t,
            sent=None if wait is None else t + float(wait),
            end=None if latency is None else t + float(latency),
            status=d.get("status"), bytes_in=int(d.get("bytes") or 0),
            ttft=None if ttft is None else float(ttft), token_times=token_times,
            error=d.get("error"),
        )  # fmt: skip


def arrival_schedule(
    rate: float, count: int, *, arrivals: str = "poisson", seed: int = 0
) -> list[float]:
    """Send times (seconds from the start) of ``count`` requests at ``rate`` per second."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate) if arrivals == "poisson" else 1.0 / rate
    return out


class _Target:
    """The parsed URL: where to connect and what to put on the request line."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.netloc = parts.netloc


class _Pool:
    """Idle keep-alive connections; new ones are opened as the load needs them."""

    def __init__(self, target: _Target, limit: int) -> None:
        self.target = target
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.slots = asyncio.Semaphore(limit)

    async def get(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self.idle:
            reader, writer = self.idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer
        ctx = ssl.create_default_context() if self.target.tls else None
        return await asyncio.open_connection(self.target.host, self.target.port, ssl=ctx)

    def put(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.idle.append(conn)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


class _Driver:
    def __init__(self, plan: LoadPlan, stop: threading.Event | None) -> None:
        self.plan = plan
        self.stop = stop or threading.Event()
        self.target = _Target(plan.url)
        limit = MAX_CONNECTIONS if plan.rate is not None else (plan.concurrency or 1)
        self.pool = _Pool(self.target, limit)
        self.results: list[RequestResult] = []
        self.t0 = 0.0
        heads = {"Host": self.target.netloc, "User-Agent": "acceptrun-load", "Accept": "*/*"}
        if plan.stream:
            heads["Accept"] = "text/event-stream"
        if plan.method != "GET":
            heads["Content-Type"] = "application/json"
        heads.update(plan.headers)
        self.head = "".join(f"{k}: {v}\r\n" for k, v in heads.items())

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _request_bytes(self, index: int) -> bytes:
        body = self.plan.bodies[index % len(self.plan.bodies)]
        line = f"{self.plan.method} {self.target.path} HTTP/1.1\r\n{self.head}"
        if self.plan.method != "GET" or body:
            line += f"Content-Length: {len(body)}\r\n"
        return (line + "\r\n").encode("latin-1") + body

    async def one(self, res: RequestResult) -> None:
        """Send one request and read its whole answer; every failure lands in ``res.error``."""
        async with self.pool.slots:
            conn = None
            try:
                # asyncio.timeout, not wait_for: no extra task per request (CPU per request)
                async with asyncio.timeout(self.plan.timeout):
                    conn = await self.pool.get()
                res.sent = self.now()
                left = self.plan.timeout - (res.sent - res.intended)
                async with asyncio.timeout(max(left, 0.001)):
                    keep = await self._exchange(conn, res)
                if keep:
                    self.pool.put(conn)
                    conn = None
            except TimeoutError:
                res.error = f"timed out after {self.plan.timeout:g} s"
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                res.error = f"{type(exc).__name__}: {exc}"[:300]
            finally:
                res.end = self.now()
                if conn is not None:
                    conn[1].close()
        self.results.append(res)

    async def _exchange(
        self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], res: RequestResult
    ) -> bool:
        """Write the request, read the response; True when the connection can be reused."""
        reader, writer = conn
        writer.write(self._request_bytes(res.index))
        await writer.drain()
        status_line = await reader.readline()
        if not status_line:
            raise ValueError("connection closed before a status line")
        parts = status_line.decode("latin-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise ValueError(f"bad status line {status_line[:80]!r}")
        res.status = int(parts[1])
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        sse = _SSE(self, res) if self.plan.stream else None
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await reader.readline()
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                self._got(res, await reader.readexactly(size), sse)
                await reader.readexactly(2)
        elif "content-length" in headers:
            n = int(headers["content-length"])
            while n > 0:
                data = await reader.read(min(n, READ_CHUNK))
                if not data:
                    raise asyncio.IncompleteReadError(b"", n)
                n -= len(data)
                self._got(res, data, sse)
        else:
            while data := await reader.read(READ_CHUNK):
                self._got(res, data, sse)
            return False
        if sse is not None:
            sse.feed(b"\n\n")  # an event the server left unterminated
        return headers.get("connection", "").lower() != "close"

    def _got(self, res: RequestResult, data: bytes, sse: _SSE | None) -> None:
        if res.bytes_in == 0 and data and sse is None:
            res.ttft = self.now() - res.intended
        res.bytes_in += len(data)
        if sse is not None:
            sse.feed(data)

    async def open_loop(self) -> None:
        plan = self.plan
        assert plan.rate is not None
        count = plan.requests
        if count is None:
            assert plan.duration is not None
            count = int(plan.rate * plan.duration * 1.5) + 100  # cut by the duration below
        schedule = arrival_schedule(plan.rate, count, arrivals=plan.arrivals, seed=plan.seed)
        tasks = []
        for i, at in enumerate(schedule):
            if plan.duration is not None and at >= plan.duration:
                break
            if self.stop.is_set():
                break
            delay = at - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self.one(RequestResult(i, at))))
        await asyncio.gather(*tasks)

    async def closed_loop(self) -> None:
        plan = self.plan
        counter = iter(range(plan.requests if plan.requests is not None else 2**62))

        async def client() -> None:
            for i in counter:
                if self.stop.is_set() or (
                    plan.duration is not None and self.now() >= plan.duration
                ):
                    return
                await self.one(RequestResult(i, self.now()))

        await asyncio.gather(*(client() for _ in range(plan.concurrency or 1)))

    async def main(self) -> list[RequestResult]:
        self.t0 = time.perf_counter()
        try:
            if self.plan.rate is not None:
                await self.open_loop()
            else:
                await self.closed_loop()
        finally:
            self.pool.close()
        return sorted(self.results, key=lambda r: r.index)


class _SSE:
    """Server-sent events: each ``data:`` event other than ``[DONE]`` is one token."""

    def __init__(self, driver: _Driver, res: RequestResult) -> None:
        self.driver, self.res, self.buf = driver, res, b""

    def feed(self, data: bytes) -> None:
        self.buf += data.replace(b"\r\n", b"\n")
        while b"\n\n" in self.buf:
            event, self.buf = self.buf.split(b"\n\n", 1)
            payload = [ln[5:].strip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
            if not payload or payload == [b"[DONE]"]:
                continue
            t = self.driver.now()
            if self.res.ttft is None:
                self.res.ttft = t - self.res.intended
            self.res.token_times.append(t)


def run_load(plan: LoadPlan, *, stop: threading.Event | None = None) -> list[RequestResult]:
    """Drive the plan to its end (or until ``stop`` is set); results by request index.

    Runs its own event loop: call it from a thread of its own, not from async code.
    """
    return asyncio.run(_Driver(plan, stop).main())
