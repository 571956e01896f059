"""A serving run's figures and the verdict's checks of them.

``summarize(results, ...)`` turns the load generator's per-request results into the
figures of ``serving.json``; ``serving_checks(record, spec)`` judges them against the
spec's ``[serving]`` limits. Definitions (docs/inference.md, "Serving runs"):

- latency: end of the answer minus the request's intended send time (open loop) or its
  send time (closed loop); p50/p90/p99 by nearest rank over the successful requests;
- TTFT: first token (first server-sent ``data:`` event) minus the intended send time;
  ITL: gaps between a request's consecutive tokens, over all of them; TPOT: per request,
  (latency - TTFT) / (tokens - 1), as vLLM's benchmark defines it;
- error rate: requests with status >= 400, a broken answer or a timeout, over all sent;
- requests/s: successful requests over the load's wall time (first intended send to the
  last answer; over several attempts, the sum of their loads' spans); goodput: successful
  requests that met every ``slo_*``, per second;
- cold start: launch (the server process started) to ready, and to the first
  successful response;
- downtime: seconds without a ready server after the first ready, from a server's exit
  to the next attempt's ready (:mod:`.service`);
- cost per 1,000 requests: the ledger's total USD x 1000 / successful requests.

A run whose server was restarted is judged as one service: the run-level serving.json
counts every request of every attempt (:mod:`.service`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from acceptrun.record.workspace import RunRecord
from acceptrun.serving.load import RequestResult
from acceptrun.spec.model import RunSpec, ServingSpec, format_duration

__all__ = [
    "by_attempt",
    "cost_per_1k",
    "downtime_text",
    "percentile",
    "serving_checks",
    "summarize",
]

CheckRow = tuple[str, str, str, bool, str, str | None]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile ``q`` (0-100); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def _tpot(r: RequestResult) -> float | None:
    if r.latency is None or r.ttft is None or len(r.token_times) < 2:
        return None
    return (r.latency - r.ttft) / (len(r.token_times) - 1)


def meets_slos(r: RequestResult, slo: ServingSpec) -> bool:
    """A successful request within every per-request SLO the spec sets."""
    if not r.ok or r.latency is None:
        return False
    if slo.slo_latency is not None and r.latency > slo.slo_latency:
        return False
    if slo.slo_ttft is not None and (r.ttft is None or r.ttft > slo.slo_ttft):
        return False
    tpot = _tpot(r)
    return not (slo.slo_itl is not None and tpot is not None and tpot > slo.slo_itl)


def summarize(
    results: Sequence[RequestResult], slo: ServingSpec, *, seconds: float | None = None
) -> dict[str, Any]:
    """The load's figures (module docstring) as plain data for serving.json.

    ``seconds`` is the span the rates are over; by default the load's own (first intended
    send to the last answer), which means nothing for requests of several attempts, whose
    times each start at their own attempt's load: :func:`combine` passes the sum of spans.
    """
    ok = [r for r in results if r.ok]
    lat = [r.latency for r in ok if r.latency is not None]
    ttft = [r.ttft for r in ok if r.ttft is not None and slo.stream]
    itl = [b - a for r in ok for a, b in zip(r.token_times, r.token_times[1:], strict=False)]
    tpot = [t for r in ok if (t := _tpot(r)) is not None]
    ends = [r.end for r in results if r.end is not None]
    span = (max(ends) - min(r.intended for r in results)) if ends else 0.0
    span = span if seconds is None else seconds
    good = sum(1 for r in results if meets_slos(r, slo))
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            key = r.error or f"HTTP {r.status}"
            errors[key] = errors.get(key, 0) + 1
    n = len(results)

    def pct(values: list[float]) -> dict[str, float | None]:
        return {f"p{q}": _round(percentile(values, q)) for q in (50, 90, 99)} | {
            "max": _round(max(values) if values else None),
            "mean": _round(sum(values) / len(values) if values else None),
        }

    return {
        "mode": "open" if slo.rate is not None else "closed",
        "rate": slo.rate,
        "arrivals": slo.arrivals if slo.rate is not None else None,
        "concurrency": slo.concurrency,
        "stream": slo.stream,
        "requests": n,
        "ok": len(ok),
        "errors": n - len(ok),
        "error_rate": (n - len(ok)) / n if n else None,
        "error_kinds": dict(sorted(errors.items(), key=lambda kv: -kv[1])[:10]),
        "seconds": round(span, 6),
        "requests_per_s": len(ok) / span if span > 0 else None,
        "good": good,
        "goodput": good / span if span > 0 else None,
        "latency": pct(lat),
        "ttft": pct(ttft) if slo.stream else None,
        "itl": pct(itl) if slo.stream else None,
        "tpot": pct(tpot) if slo.stream else None,
        "tokens": sum(len(r.token_times) for r in ok) if slo.stream else None,
        "bytes_in": sum(r.bytes_in for r in results),
        "slo": {
            "latency": slo.slo_latency,
            "ttft": slo.slo_ttft,
            "itl": slo.slo_itl,
        },
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def cost_per_1k(summary: dict[str, Any], ledger: Any) -> tuple[float | None, str]:
    """USD per 1,000 successful requests from ledger.json, and the price label."""
    if not isinstance(ledger, dict) or not ledger.get("priced"):
        return None, ""
    ok = int(summary.get("ok") or 0)
    total = float(ledger.get("total_usd") or (ledger.get("compute") or {}).get("usd") or 0.0)
    label = str((ledger.get("price") or {}).get("label", "?"))
    return (total * 1000 / ok if ok else None), label


def ms(seconds: Any) -> str:
    """``12.3 ms`` / ``1.20 s``; "-" when absent."""
    if not isinstance(seconds, int | float):
        return "-"
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.2f} s"


def serving_checks(record: RunRecord, spec: RunSpec) -> list[CheckRow]:
    """The verdict's checks of a serving run as ``(group, name, status, required, evidence,
    fix)``; the verdict (verdict/checks/results.py) wraps them in its Check. Empty for other runs."""
    sv = spec.serving
    if not sv.enabled:
        return []
    s = record.read_json("serving.json")
    ready = s.get("ready") if isinstance(s, dict) else None
    if not isinstance(s, dict) or not isinstance(ready, dict):
        return [("setup", "ready", "not_recorded", True, "no serving.json in the record",
                 "the server never started: read attempts/1/stderr.log")]  # fmt: skip
    out: list[CheckRow] = [_ready_check(sv, s)]
    load = s.get("load")
    if not isinstance(load, dict) or not load.get("requests"):
        why = s.get("load_error") or "no request was sent"
        out.append(("results", "load", "fail", True, str(why),
                    "read the server's stderr.log; the load starts once it is ready"))  # fmt: skip
        return out
    attempts = [a for a in s.get("attempts") or [] if isinstance(a, dict)]
    out.append(_load_check(s, load, attempts))
    lat = load.get("latency") or {}
    for q in (50, 90, 99):
        limit = getattr(sv, f"max_latency_p{q}")
        out.append(_limit(f"latency p{q}", lat.get(f"p{q}"), limit, load, "results"))
    if sv.stream:
        ttft, itl, tpot = load.get("ttft") or {}, load.get("itl") or {}, load.get("tpot") or {}
        row = _limit("ttft p99", ttft.get("p99"), sv.max_ttft_p99, load, "results")
        evidence = f"{row[4]}; TTFT p50 {ms(ttft.get('p50'))}; ITL p50 {ms(itl.get('p50'))}, "
        evidence += f"p99 {ms(itl.get('p99'))}; TPOT p50 {ms(tpot.get('p50'))}; "
        evidence += f"{load.get('tokens') or 0:,} tokens"
        out.append((*row[:4], evidence, row[5]))
    out.append(_error_check(sv, load, attempts))
    if isinstance(s.get("downtime"), dict):  # records from before attempts were kept lack it
        limit = spec.acceptance.max_downtime
        out.append(_downtime_check(s["downtime"], len(attempts), limit))
    out.append(_goodput_check(sv, load))
    out.append(_rps_check(sv, load))
    out.append(_cost_check(sv, load, record.read_json("ledger.json")))
    return out


def _ready_check(sv: ServingSpec, s: dict[str, Any]) -> CheckRow:
    ready = s["ready"]
    first = s.get("first_success_s")
    if not ready.get("ok"):
        tail = " | ".join(str(x) for x in (ready.get("stderr_tail") or [])[-3:])
        evidence = f"not ready: {ready.get('reason')}"
        evidence += f"; stderr: {tail}" if tail else "; stderr was empty"
        fix: str | None = (
            "read the server's stderr.log; check serving.ready_url / ready_log match what the "
            "server serves or prints, or raise serving.ready_timeout"
        )
        return ("setup", "ready", "fail", True, evidence, fix)
    evidence = f"ready {float(ready.get('seconds') or 0):.2f}s after launch ({ready.get('by')})"
    if (ready.get("attempt") or 1) > 1:  # an earlier attempt exited before it was ready
        evidence += f" in attempt {ready['attempt']} (cold start from the first launch)"
    evidence += (
        f"; first successful response {first:.2f}s after launch"
        if first is not None
        else ("; no successful response")
    )
    limit = sv.max_cold_start
    if limit is None:
        return ("setup", "ready", "pass", True, evidence + " (no max_cold_start)", None)
    ok = first is not None and first <= limit
    evidence += f", at most {limit:g}s"
    fix = (
        None
        if ok
        else "make the server load faster (a smaller model, a warm cache), or raise serving.max_cold_start"
    )
    return ("setup", "ready", "pass" if ok else "fail", True, evidence, fix)


def _load_check(
    s: dict[str, Any], load: dict[str, Any], attempts: list[dict[str, Any]]
) -> CheckRow:
    mode = (
        f"open loop, {load.get('arrivals')} arrivals at {load.get('rate'):g}/s"
        if load.get("mode") == "open"
        else f"closed loop, {load.get('concurrency')} clients"
    )
    text = f"{load['requests']:,} requests, {mode}, over {load.get('seconds', 0):.1f}s"
    if len(attempts) > 1:
        text += f" of load in {len(attempts)} attempts ({by_attempt(attempts)})"
    if s.get("interrupted"):
        cause = attempts[-1].get("ended") if attempts else None
        text += f"; cut short: {s['interrupted']}" + (f" ({cause})" if cause else "")
        return ("results", "load", "fail", True, text, "read the server's stderr.log")
    return ("results", "load", "pass", True, text, None)


def by_attempt(attempts: list[dict[str, Any]]) -> str:
    """``attempt 1: 2 of 24 failed, cut short (killed by SIGKILL); attempt 2: 0 of 99 failed``."""
    parts = []
    for a in attempts:
        text = f"attempt {a.get('attempt')}: "
        if a.get("not_ready"):
            text += f"not ready ({a['not_ready']})"
        else:
            text += f"{a.get('failed', 0):,} of {a.get('requests', 0):,} failed"
        if a.get("interrupted"):
            text += f", cut short ({a.get('ended') or a['interrupted']})"
        parts.append(text)
    return "; ".join(parts)


def downtime_text(downtime: dict[str, Any]) -> str:
    """``1.20s without a ready server after attempt 1 (killed by SIGKILL), until attempt 2 was
    ready``: each window, its cause and how it ended; "none" without one."""
    parts = []
    for w in downtime.get("windows") or []:
        after = f"after attempt {w.get('after_attempt')} ({w.get('cause')})"
        if w.get("restored_by") is not None:
            parts.append(f"{w['seconds']:.2f}s {after}, until attempt {w['restored_by']} was ready")
        elif w.get("seconds") is not None:
            parts.append(f"{w['seconds']:.2f}s {after}, to the end of the run: no later attempt "
                         "became ready")  # fmt: skip
        else:
            parts.append(f"from the exit {after} to the end of the run: no later attempt became "
                         "ready")  # fmt: skip
    if not parts:
        return "none"
    total = f"{float(downtime.get('seconds') or 0):.2f}s without a ready server"
    if len(parts) == 1:
        return parts[0].replace(" after attempt", " without a ready server after attempt", 1)
    return f"{total} in {len(parts)} windows: " + "; ".join(parts)


def _limit(
    name: str, value: Any, limit: float | None, load: dict[str, Any], group: str
) -> CheckRow:
    base = f"{ms(value)} over {load.get('ok', 0):,} successful requests"
    if limit is None:
        status = "pass" if value is not None else "not_recorded"
        return (group, name, status, False, base + " (no limit in the spec)", None)
    if value is None:
        return (group, name, "not_recorded", True, "no successful request", "see the error rate")
    ok = value <= limit
    fix = None if ok else (
        f"find the slow requests in serving/requests.jsonl (latency over time in the report), "
        f"lower the load, or raise serving.max_{name.replace(' ', '_')}"
    )  # fmt: skip
    return (group, name, "pass" if ok else "fail", True, f"{base}, at most {ms(limit)}", fix)


def _error_check(sv: ServingSpec, load: dict[str, Any], attempts: list[dict[str, Any]]) -> CheckRow:
    rate = float(load.get("error_rate") or 0.0)
    kinds = "; ".join(f"{k} x{v}" for k, v in (load.get("error_kinds") or {}).items())
    text = f"{rate:.2%} of {load.get('requests', 0):,} requests failed"
    text += f" ({kinds})" if kinds else ""
    text += f"; {by_attempt(attempts)}" if len(attempts) > 1 else ""
    if sv.max_error_rate is None:
        return ("results", "error rate", "pass", False, text + " (no limit in the spec)", None)
    ok = rate <= sv.max_error_rate + 1e-12
    fix = None if ok else "the failed requests are in serving/requests.jsonl (status, error)"
    return ("results", "error rate", "pass" if ok else "fail", True,
            f"{text}, at most {sv.max_error_rate:.2%}", fix)  # fmt: skip


def _downtime_check(
    downtime: dict[str, Any], attempts: int, limit: float | None = None
) -> CheckRow:
    """The seconds the service had no ready server after its first ready: information, or
    judged against ``acceptance.max_downtime`` (seconds) when the spec sets it."""
    windows = downtime.get("windows") or []
    bound = "" if limit is None else f", at most {format_duration(limit)} (acceptance.max_downtime)"
    if not windows:
        text = "none: the server stayed up from its first ready to the end of the load"
        return ("results", "downtime", "pass", limit is not None,
                text + f" ({attempts} attempt(s)){bound}", None)  # fmt: skip
    text = downtime_text(downtime)
    text += " (from the supervisor seeing the server exit to the next readiness probe answered)"
    first = windows[0].get("after_attempt")
    fix = f"read attempts/{first}/stderr.log and exit.json: why the server exited during the load"
    if limit is None:
        return ("results", "downtime", "fail", False, text, fix)
    # A window no attempt closed has no end: the outage outlasted the run, past any bound.
    ended = all(w.get("restored_by") is not None for w in windows)
    total = float(downtime.get("seconds") or 0.0)
    if ended and total <= limit + 1e-9:
        return ("results", "downtime", "pass", True, f"{text}{bound}", None)
    measured = (
        f"{total:.2f}s measured" if ended
        else f"at least {total:.2f}s, no ready server at the end of the run"
    )  # fmt: skip
    fix += f", or raise acceptance.max_downtime above {total:.2f}s" if ended else ""
    return ("results", "downtime", "fail", True, f"{measured}{bound}: {text}", fix)


def _goodput_check(sv: ServingSpec, load: dict[str, Any]) -> CheckRow:
    gp = load.get("goodput")
    slos = [f"{k} <= {ms(v)}" for k, v in (load.get("slo") or {}).items() if v is not None]
    text = "-" if gp is None else f"{gp:,.2f} requests/s"
    text += f" ({load.get('good', 0):,} of {load.get('requests', 0):,} requests met "
    text += " and ".join(slos) if slos else "no SLO: all successful requests count"
    text += ")"
    if sv.min_goodput is None:
        return ("performance", "goodput", "pass", False, text + " (no minimum in the spec)", None)
    ok = gp is not None and gp >= sv.min_goodput
    fix = (
        None
        if ok
        else "lower the load or speed up the server; requests over the SLOs are in serving/requests.jsonl"
    )
    return ("performance", "goodput", "pass" if ok else "fail", True,
            f"{text}, at least {sv.min_goodput:g}/s", fix)  # fmt: skip


def _rps_check(sv: ServingSpec, load: dict[str, Any]) -> CheckRow:
    rps = load.get("requests_per_s")
    text = "-" if rps is None else f"{rps:,.2f} successful requests/s"
    if load.get("mode") == "open":
        text += f" at an offered {load.get('rate'):g}/s"
    if sv.min_requests_per_s is None:
        return (
            "performance",
            "requests/s",
            "pass",
            False,
            text + " (no minimum in the spec)",
            None,
        )
    ok = rps is not None and rps >= sv.min_requests_per_s
    fix = None if ok else "raise the offered load (rate, concurrency) or speed up the server"
    return ("performance", "requests/s", "pass" if ok else "fail", True,
            f"{text}, at least {sv.min_requests_per_s:g}/s", fix)  # fmt: skip


def _cost_check(sv: ServingSpec, load: dict[str, Any], ledger: Any) -> CheckRow:
    usd, label = cost_per_1k(load, ledger)
    limit = sv.max_usd_per_1k_requests
    if usd is None:
        why = "no priced ledger.json" if not label else "no successful request"
        return ("operations", "cost per 1k requests", "not_recorded", limit is not None, why,
                "set cost.price_per_hour or cost.provider/instance")  # fmt: skip
    text = f"{usd:.6g} USD per 1,000 requests ({load.get('ok', 0):,} successful; {label})"
    if limit is None:
        return (
            "operations",
            "cost per 1k requests",
            "pass",
            False,
            text + " (no limit in the spec)",
            None,
        )
    ok = usd <= limit + 1e-12
    fix = (
        None
        if ok
        else "serve more requests per machine-hour (batching, a smaller model) or raise the limit"
    )
    return ("operations", "cost per 1k requests", "pass" if ok else "fail", True,
            f"{text}, at most {limit:g}", fix)  # fmt: skip
