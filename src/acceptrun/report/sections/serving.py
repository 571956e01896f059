"""A serving run's figures in `acceptrun show` and in the HTML report.

Both read ``serving.json`` (the service over every attempt, :mod:`acceptrun.serving.service`) and the
ledger; the report also reads ``serving/requests.jsonl`` for a latency histogram and
latency over time beside the load level, each attempt's requests placed at their time
since the first attempt's load started. A run without ``serving.json`` shows nothing here.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

from acceptrun._util.durable import read_jsonl
from acceptrun.record.workspace import RunRecord
from acceptrun.report.svg import Mark, Series, line_chart
from acceptrun.serving.summary import by_attempt, cost_per_1k, downtime_text, ms, percentile

__all__ = ["serving_html", "serving_lines"]

HIST_BUCKETS = 40
WINDOW_S = 1.0  # seconds per point of the over-time charts


def _rows(s: dict[str, Any], ledger: Any) -> list[tuple[str, str]]:
    ready = s.get("ready") or {}
    if not ready.get("ok"):
        tail = " | ".join(str(x) for x in (ready.get("stderr_tail") or [])[-3:])
        return [("ready", f"NOT READY: {ready.get('reason')}"), ("stderr", tail or "(empty)")]
    first = s.get("first_success_s")
    rows = [
        (
            "cold start",
            f"ready {float(ready.get('seconds') or 0):.2f}s after launch ({ready.get('by')}); "
            f"first successful response {'-' if first is None else f'{first:.2f}s'}",
        )
    ]
    load = s.get("load")
    if not isinstance(load, dict):
        return [*rows, ("load", str(s.get("load_error") or "no load ran"))]
    mode = (
        f"open loop, {load.get('arrivals')} at {load.get('rate'):g}/s"
        if load.get("mode") == "open"
        else f"closed loop, {load.get('concurrency')} clients"
    )
    lat = load.get("latency") or {}
    rps, gp = load.get("requests_per_s"), load.get("goodput")
    n = len(s.get("attempts") or [])
    several = f" of load in {n} attempts" if n > 1 else ""
    rows += [
        ("load", f"{load.get('requests', 0):,} requests ({mode}) over {load.get('seconds', 0):.1f}s"
                 + several
                 + (f"; cut short: {s['interrupted']}" if s.get("interrupted") else "")),
        ("latency", f"p50 {ms(lat.get('p50'))}, p90 {ms(lat.get('p90'))}, p99 {ms(lat.get('p99'))}, "
                    f"max {ms(lat.get('max'))}"),
        ("errors", f"{float(load.get('error_rate') or 0):.2%} ({load.get('errors', 0):,} of "
                   f"{load.get('requests', 0):,})"
                   + "".join(f"; {k} x{v}" for k, v in (load.get("error_kinds") or {}).items())),
        ("throughput", f"{'-' if rps is None else f'{rps:,.2f}'} requests/s; goodput "
                       f"{'-' if gp is None else f'{gp:,.2f}'} requests/s "
                       f"({load.get('good', 0):,} within the SLOs)"),
    ]  # fmt: skip
    if load.get("stream"):
        ttft, itl, tpot = load.get("ttft") or {}, load.get("itl") or {}, load.get("tpot") or {}
        rows.append((
            "tokens",
            f"TTFT p50 {ms(ttft.get('p50'))}, p99 {ms(ttft.get('p99'))}; ITL p50 "
            f"{ms(itl.get('p50'))}, p99 {ms(itl.get('p99'))}; TPOT p50 {ms(tpot.get('p50'))}; "
            f"{load.get('tokens') or 0:,} tokens",
        ))  # fmt: skip
    attempts = [a for a in s.get("attempts") or [] if isinstance(a, dict)]
    if len(attempts) > 1:
        rows.append(("attempts", by_attempt(attempts)))
    downtime = s.get("downtime")
    if isinstance(downtime, dict) and downtime.get("windows"):
        rows.append(("downtime", downtime_text(downtime)))
    usd, label = cost_per_1k(load, ledger)
    rows.append(
        ("cost", "not priced" if usd is None else f"{usd:.6g} USD per 1,000 requests ({label})")
    )
    return rows


def serving_lines(record: RunRecord) -> list[str]:
    """Lines for `acceptrun show` (``serving  ...``); none for other runs."""
    s = record.read_json("serving.json")
    if not isinstance(s, dict):
        return []
    rows = _rows(s, record.read_json("ledger.json"))
    return [f"{'serving' if i == 0 else '':<8} {k}: {v}" for i, (k, v) in enumerate(rows)]


def serving_html(record: RunRecord) -> list[str]:
    """The report's "Serving" section: figures, latency histogram, latency and load over time."""
    s = record.read_json("serving.json")
    if not isinstance(s, dict):
        return []
    rows = _rows(s, record.read_json("ledger.json"))
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    out = ['<h2 id="serving">Serving</h2>', f"<table>{body}</table>"]
    path = record.file("serving/requests.jsonl")
    reqs = list(read_jsonl(path)) if path.exists() else []
    if reqs:
        out += [_histogram(reqs), *_over_time(_on_one_clock(reqs, s))]
    return out


def _on_one_clock(reqs: list[dict[str, Any]], s: dict[str, Any]) -> list[dict[str, Any]]:
    """Requests with ``t`` from the first attempt's load start (each attempt's own start)."""
    starts = {
        a.get("attempt"): float(a["load_started_at"])
        for a in s.get("attempts") or []
        if isinstance(a, dict) and isinstance(a.get("load_started_at"), int | float)
    }
    if len(starts) < 2:
        return reqs
    t0 = min(starts.values())
    return [{**r, "t": float(r["t"]) + starts.get(r.get("attempt"), t0) - t0} for r in reqs]


def _histogram(reqs: list[dict[str, Any]]) -> str:
    """Latency histogram of the successful requests, drawn as a staircase (ms, count)."""
    lat = [1000 * float(r["latency"]) for r in reqs if _ok(r)]
    if not lat:
        return line_chart([], title="Latency histogram", x_label="ms", y_label="requests")
    lo, hi = min(lat), max(lat)
    width = (hi - lo) / HIST_BUCKETS or 1.0
    counts = [0] * HIST_BUCKETS
    for v in lat:
        counts[min(int((v - lo) / width), HIST_BUCKETS - 1)] += 1
    pts: list[tuple[float, float]] = []
    for i, c in enumerate(counts):
        pts += [(lo + i * width, c), (lo + (i + 1) * width, c)]
    marks = [
        Mark(p, f"p{q}", f"{p:.1f} ms")  # the mark's kind names it in the legend
        for q in (50, 99)
        if (p := percentile(lat, q)) is not None
    ]
    return line_chart(
        [Series("requests per bucket", pts)], title="Latency histogram (p50, p99 marked)",
        x_label="latency, ms (from the intended send)", y_label="requests", marks=marks, y_min=0,
    )  # fmt: skip


def _over_time(reqs: list[dict[str, Any]]) -> list[str]:
    """Latency per window (p50, p99, by send time) and the load (offered, completed, failed/s)."""
    end = max(float(r["t"]) + float(r.get("latency") or 0) for r in reqs)
    n = max(1, math.ceil(end / WINDOW_S))
    by_window: list[list[float]] = [[] for _ in range(n)]
    offered, done, failed = [0] * n, [0] * n, [0] * n
    for r in reqs:
        w = min(int(float(r["t"]) / WINDOW_S), n - 1)
        offered[w] += 1
        if _ok(r):
            by_window[w].append(1000 * float(r["latency"]))
            done[min(int((float(r["t"]) + float(r["latency"])) / WINDOW_S), n - 1)] += 1
        else:
            failed[w] += 1
    xs = [(i + 0.5) * WINDOW_S for i in range(n)]
    p50 = [(x, percentile(v, 50) or math.nan) for x, v in zip(xs, by_window, strict=True)]
    p99 = [(x, percentile(v, 99) or math.nan) for x, v in zip(xs, by_window, strict=True)]
    latency = line_chart(
        [Series("p50", p50), Series("p99", p99)], title="Latency over time (by intended send)",
        x_label="seconds since the load started", y_label="latency, ms", y_min=0,
    )  # fmt: skip
    per_s = 1.0 / WINDOW_S
    load = line_chart(
        [
            Series("sent (offered) /s", [(x, c * per_s) for x, c in zip(xs, offered, strict=True)]),
            Series("completed /s", [(x, c * per_s) for x, c in zip(xs, done, strict=True)]),
            Series("failed /s", [(x, c * per_s) for x, c in zip(xs, failed, strict=True)]),
        ],
        title="Load level", x_label="seconds since the load started", y_label="requests/s",
        y_min=0,
    )  # fmt: skip
    return [latency, load]


def _ok(r: dict[str, Any]) -> bool:
    status = r.get("status")
    return (
        r.get("error") is None
        and isinstance(status, int)
        and status < 400
        and isinstance(r.get("latency"), int | float)
    )
