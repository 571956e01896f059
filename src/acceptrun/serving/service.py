"""The service over every attempt of a serving run: what the run-level serving.json holds.

A server that dies during its load is restarted like any failed attempt, and the next
attempt sends the whole load again. The verdict is about the service, so the requests of
the cut attempt count as much as the others, and the time between the server's exit and
the next ready is downtime. The record keeps both levels:

- ``attempts/<n>/serving.json``: attempt n alone (its readiness, cold start, the figures
  of its own load, whether it was cut short, and how the attempt ended);
- ``serving/requests.jsonl``: every request of every attempt, each line with its
  ``attempt`` (``t`` stays seconds from the start of that attempt's load);
- ``serving.json``: :func:`combine` of the two, with the keys a one-attempt record has
  always had (``ready``, ``first_success_s``, ``load``, ``interrupted``) plus
  ``attempts`` (a line per attempt) and ``downtime``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from acceptrun._util.durable import read_json, read_jsonl, write_json_atomic
from acceptrun.record.workspace import RunRecord
from acceptrun.serving.load import RequestResult
from acceptrun.serving.summary import summarize
from acceptrun.spec.model import ServingSpec

__all__ = ["REQUESTS_FILE", "attempt_file", "attempt_summaries", "combine", "write_service"]

REQUESTS_FILE = "serving/requests.jsonl"


def attempt_file(attempt: int) -> str:
    """The record path of one attempt's own serving summary."""
    return f"attempts/{attempt}/serving.json"


def attempt_summaries(record: RunRecord) -> list[dict[str, Any]]:
    """Every attempt's own serving summary, by attempt number."""
    root = record.file("attempts")
    found = []
    if root.is_dir():
        for d in root.iterdir():
            path = d / "serving.json"
            if d.name.isdigit() and path.is_file() and isinstance(s := read_json(path), dict):
                found.append(s)
    return sorted(found, key=lambda s: int(s.get("attempt") or 0))


def write_service(record: RunRecord, slo: ServingSpec) -> None:
    """Rewrite the run-level serving.json from every attempt's summary and request."""
    lines = list(read_jsonl(record.file(REQUESTS_FILE)))
    service = combine(attempt_summaries(record), lines, slo)
    if service:
        write_json_atomic(record.file("serving.json"), service)


def combine(
    attempts: Sequence[dict[str, Any]], lines: Sequence[dict[str, Any]], slo: ServingSpec
) -> dict[str, Any]:
    """The service's figures from the attempts' summaries and all their request lines.

    Every request of every attempt counts in the error rate, the percentiles and the
    goodput; the rates are over the sum of the attempts' load spans (the time between
    them is downtime, a figure of its own). Cold start is counted from the first
    attempt's launch: to the first ready, and to the first successful response.
    """
    if not attempts:
        return {}
    first, last = attempts[0], attempts[-1]
    t0 = float(first.get("launched_at") or 0.0)
    ready_at = {
        int(a["attempt"]): float(a.get("launched_at") or 0.0) + float(a["ready"]["seconds"])
        for a in attempts
        if (a.get("ready") or {}).get("ok")
        and isinstance((a.get("ready") or {}).get("seconds"), int | float)
    }
    first_ready = next((a for a in attempts if int(a["attempt"]) in ready_at), None)
    if first_ready is None:  # never ready: the last attempt's reason and stderr
        ready = dict(last.get("ready") or {})
    else:
        n = int(first_ready["attempt"])
        ready = {**first_ready["ready"], "seconds": round(ready_at[n] - t0, 6), "attempt": n}
    successes = [
        float(a.get("launched_at") or 0.0) + float(a["first_success_s"])
        for a in attempts
        if a.get("first_success_s") is not None
    ]
    loaded = [a for a in attempts if isinstance(a.get("load"), dict)]
    load = None
    if loaded:
        span = sum(float(a["load"].get("seconds") or 0.0) for a in loaded)
        load = summarize([RequestResult.from_dict(d) for d in lines], slo, seconds=span)
    out: dict[str, Any] = {
        "attempt": last.get("attempt"),
        "launched_at": t0,
        "ready": ready,
        "first_success_s": round(min(successes) - t0, 6) if successes else None,
        "load_started_at": loaded[0].get("load_started_at") if loaded else None,
        "load": load,
        "interrupted": _end_of_service(last, load is not None),
        "attempts": [_breakdown(a) for a in attempts],
        "downtime": _downtime(attempts, ready_at),
    }
    if load is None:
        out["load_error"] = last.get("load_error")
    return out


def _end_of_service(last: dict[str, Any], loaded: bool) -> str | None:
    """Why the service's last attempt did not serve its whole load, or None when it did."""
    if last.get("interrupted"):
        return str(last["interrupted"])
    if not loaded:
        return None  # no attempt loaded: the ready and load checks say why
    n = last.get("attempt")
    ready = last.get("ready") or {}
    if not ready.get("ok"):
        return f"attempt {n} was not ready: {ready.get('reason')}"
    if last.get("load_error"):
        return f"attempt {n}: {last['load_error']}"
    return None


def _breakdown(a: dict[str, Any]) -> dict[str, Any]:
    """One attempt's line in the run-level summary."""
    load: dict[str, Any] = a["load"] if isinstance(a.get("load"), dict) else {}
    ready = a.get("ready") or {}
    ended = a.get("ended") or {}
    return {
        "attempt": a.get("attempt"),
        "launched_at": a.get("launched_at"),
        "ready_s": ready.get("seconds") if ready.get("ok") else None,
        "not_ready": None if ready.get("ok") else ready.get("reason"),
        "load_started_at": a.get("load_started_at"),
        "requests": int(load.get("requests") or 0),
        "ok": int(load.get("ok") or 0),
        "failed": int(load.get("errors") or 0),
        "load_s": load.get("seconds"),
        "interrupted": a.get("interrupted"),
        "load_error": a.get("load_error"),
        "ended": ended.get("reason"),
        "class": ended.get("class"),
        "exited_at": a.get("exited_at"),
    }


def _downtime(attempts: Sequence[dict[str, Any]], ready_at: dict[int, float]) -> dict[str, Any]:
    """Seconds without a ready server after the first ready, window by window.

    A window opens when an attempt's server exits (the supervisor saw it gone) and another
    attempt follows, and closes when a later attempt answers its readiness probe; one that
    no attempt closed runs to the last attempt's exit (the run ended without a server).
    """
    windows: list[dict[str, Any]] = []
    opened: tuple[int, float, str] | None = None  # attempt, since (unix seconds), cause
    seen_ready = False
    for i, a in enumerate(attempts):
        n = int(a["attempt"])
        if n in ready_at:
            if opened is not None:
                windows.append(_window(*opened, until=ready_at[n], restored_by=n))
                opened = None
            seen_ready = True
        if seen_ready and opened is None and i < len(attempts) - 1:
            since = a.get("exited_at") or attempts[i + 1].get("launched_at")
            if since is not None:
                opened = (n, float(since), _cause(a))
    if opened is not None:
        until = attempts[-1].get("exited_at")
        windows.append(_window(*opened, until=None if until is None else float(until)))
    total = sum(w["seconds"] for w in windows if w["seconds"] is not None)
    return {"seconds": round(total, 6), "windows": windows}


def _window(
    attempt: int, since: float, cause: str, *, until: float | None, restored_by: int | None = None
) -> dict[str, Any]:
    return {
        "after_attempt": attempt,
        "since": since,
        "until": until,
        "seconds": None if until is None else round(max(0.0, until - since), 6),
        "cause": cause,
        "restored_by": restored_by,
    }


def _cause(a: dict[str, Any]) -> str:
    """How an attempt ended, in words: its exit reason and failure class."""
    ended = a.get("ended") or {}
    reason = str(ended.get("reason") or "the server exited")
    cls = ended.get("class")
    return reason if not cls or cls in reason else f"{reason} ({cls})"
