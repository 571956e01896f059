"""``acceptrun top``: the workspace's running runs, live, one row each.

A run is running when its run.json says so (created, preflight, running, closing) and
its process is alive: the recorded supervisor for a supervised run, the workload's pid
(its ``workload_start`` event) for a standalone one. Each row reads only the ends of
the run's files (the last steps, the last samples), so a refresh costs the same on
hour 1 and hour 100 of a run.

The step total and ETA come from the step events of a ``run.steps(total)`` loop (the
client writes ``total_steps`` in each), or from ``run.log(step, total_steps=N)``. Cost so far is the billed compute from launch to now at the run's
price (:mod:`acceptrun.cost`), or ``-`` when the spec names no price.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from acceptrun._util.confined import open_regular
from acceptrun._util.durable import loads_json
from acceptrun.record.liveness import interruption, is_live
from acceptrun.record.status import RUN_LIVE
from acceptrun.record.workspace import RunRecord, Workspace, iso_seconds

__all__ = ["LIVE_STATES", "format_rows", "live_rows", "run_row", "top"]

LIVE_STATES = RUN_LIVE
TAIL_BYTES = 256 * 1024  # read at most this much of the end of a JSONL file per refresh
RECENT_STEPS = 20  # steps whose median gives the throughput and the ETA


def _tail(path: Path, max_bytes: int = TAIL_BYTES) -> list[dict[str, Any]]:
    """The whole JSON lines in the last ``max_bytes`` of ``path`` (a torn last one skipped)."""
    try:
        with open_regular(path, root=path.parent) as f:  # a link, a FIFO: not read
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    if size > max_bytes:
        lines = lines[1:]  # the first line is cut by the seek
    out = []
    for raw in lines[:-1]:  # the last element is after the final newline: empty or torn
        with contextlib.suppress(ValueError):
            obj = loads_json(raw)
            if isinstance(obj, dict):
                out.append(obj)
    return out


def _cost_so_far(record: RunRecord, started: float | None, now: float) -> float | None:
    """USD billed from launch to now at the run's price; None when it has no price."""
    if started is None:
        return None
    from acceptrun.cost.billing import billed_seconds, compute_cost
    from acceptrun.cost.ledger import price_of_run

    try:
        price = price_of_run(record)[0]
    except Exception:  # a damaged spec or catalog: no cost column, never a crash of top
        return None
    return None if price is None else compute_cost(billed_seconds(started, now, price), price)


def _recent_steps(record: RunRecord) -> list[dict[str, Any]]:
    """The run's last RECENT_STEPS steps: the step log's tail (record format 2), else the
    step events at the end of events.jsonl (format 1). Never every step."""
    from acceptrun.record.steplog import StepLog

    log = StepLog(record.path)
    if log.count():
        return log.tail(RECENT_STEPS)
    return [e for e in _tail(record.events_path) if e.get("kind") == "step"]


def run_row(record: RunRecord, state: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """One run's row: id, name, attempt, step, throughput, ETA, GPU or process use, cost."""
    now = time.time() if now is None else now
    steps = _recent_steps(record)
    recent = [e for e in steps[-RECENT_STEPS:] if isinstance(e.get("step_time"), int | float)]
    times = [float(e["step_time"]) for e in recent if e["step_time"] > 0]
    last = steps[-1] if steps else {}
    total = last.get("total_steps")
    step = last.get("step")
    unit, rate = "steps/s", (1.0 / statistics.median(times)) if times else None
    for key, name in (("samples", "samples/s"), ("tokens", "tokens/s")):
        rates = [e[key] / e["step_time"] for e in recent if isinstance(e.get(key), int | float) and e["step_time"] > 0]  # fmt: skip
        if rates:
            unit, rate = name, statistics.median(rates)
            break
    eta = None
    if isinstance(total, int | float) and isinstance(step, int) and times:
        eta = max(0.0, (total - step - 1) * statistics.median(times))
    samples = _tail(record.telemetry_path)
    gpus: dict[Any, dict[str, Any]] = {}
    host: dict[str, Any] | None = None
    for s in samples:
        if s.get("kind") == "gpu":
            gpus[s.get("index")] = s
        elif s.get("kind") == "host":
            host = s
    started = iso_seconds(state.get("created_at"))
    attempts = int(state.get("attempts") or 0)
    return {
        "run_id": record.run_id,
        "name": state.get("name"),
        "status": state.get("status"),
        "attempt": attempts,
        "restarts": max(0, attempts - 1),
        "step": step,
        "total_steps": total,
        "throughput": rate,
        "throughput_unit": unit,
        "eta_s": eta,
        "elapsed_s": None if started is None else max(0.0, now - started),
        "gpus": [
            {
                "index": g.get("index"),
                "util_pct": g.get("util_pct"),
                "mem_used": g.get("mem_used"),
                "mem_total": g.get("mem_total"),
            }
            for _, g in sorted(gpus.items(), key=lambda kv: str(kv[0]))
        ],
        "proc_cpu_pct": None if host is None else host.get("proc_cpu_pct"),
        "proc_rss": None if host is None else host.get("proc_rss"),
        "cost_usd": _cost_so_far(record, started, now),
    }


def live_rows(ws: Workspace, now: float | None = None) -> list[dict[str, Any]]:
    """Rows of the workspace's running runs, oldest first."""
    rows = []
    for run_id in ws.run_ids():
        record = RunRecord(ws.runs_dir / run_id)
        try:
            state = record.state
        except Exception:  # a damaged or half-removed record is not a running run
            continue
        if state.get("status") not in LIVE_STATES:
            continue
        if not is_live(record, state):
            # A supervisor that died leaves its run interrupted (record/liveness.py): shown,
            # with its last sign of life, until `acceptrun resume` or retention acts on it.
            gone = interruption(record, str(state.get("status")))
            if gone is None or state.get("mode") == "standalone":
                continue
            row = run_row(record, state, now)
            row.update(status="interrupted", eta_s=None, last_sign_of_life=gone.last_sign_of_life)
            rows.append(row)
            continue
        rows.append(run_row(record, state, now))
    return rows


def _usage(row: dict[str, Any]) -> str:
    from acceptrun.cost.billing import format_bytes

    if row["gpus"]:
        parts = []
        for g in row["gpus"]:
            util = "-" if g["util_pct"] is None else f"{g['util_pct']:.0f}%"
            mem = "" if g["mem_used"] is None else f" {format_bytes(g['mem_used'])}"
            parts.append(f"{g['index']}:{util}{mem}")
        return " ".join(parts)
    if row["proc_cpu_pct"] is None and row["proc_rss"] is None:
        return "-"
    cpu = "-" if row["proc_cpu_pct"] is None else f"{row['proc_cpu_pct']:.0f}% CPU"
    rss = "" if row["proc_rss"] is None else f" {format_bytes(row['proc_rss'])}"
    return cpu + rss


def format_rows(rows: list[dict[str, Any]]) -> Any:
    """A Rich table of the rows (what ``top`` shows)."""
    from rich.table import Table

    from acceptrun._util.console import rich_cell
    from acceptrun.cost.billing import format_usd
    from acceptrun.spec.model import format_duration

    table = Table(title=f"acceptrun top  {time.strftime('%H:%M:%S')}", title_justify="left")
    for name, justify in (
        ("run", "left"), ("name", "left"), ("attempt", "right"), ("step", "right"),
        ("throughput", "right"), ("ETA", "right"), ("GPU util/mem or process", "left"),
        ("elapsed", "right"), ("cost", "right"),
    ):  # fmt: skip
        table.add_column(name, justify=justify, no_wrap=name == "run")  # type: ignore[arg-type]
    for r in rows:
        step = "-" if r["step"] is None else str(r["step"])
        if r["total_steps"] is not None:
            step += f"/{r['total_steps']:.0f}"
        rate = "-" if r["throughput"] is None else f"{r['throughput']:,.1f} {r['throughput_unit']}"
        attempt = f"{r['attempt']}" + (f" ({r['restarts']} restarts)" if r["restarts"] else "")
        cost = "-" if r["cost_usd"] is None else f"${format_usd(r['cost_usd'])}"
        eta, usage = format_duration(r["eta_s"]), _usage(r)
        if r["status"] == "interrupted":  # its supervisor died: nothing runs
            last = r.get("last_sign_of_life")
            eta = "interrupted"
            seen = time.strftime("%H:%M:%S", time.localtime(last)) if last else "unknown"
            usage = f"last sign of life {seen}"
        # The run's name and the workload's throughput unit as Text: never read as markup.
        table.add_row(
            rich_cell(r["run_id"]), rich_cell(r["name"]), attempt, step, rich_cell(rate),
            eta, usage, format_duration(r["elapsed_s"]), cost,
        )  # fmt: skip
    if not rows:
        table.caption = "no running runs in this workspace"
    return table


def top(ws: Workspace, *, interval: float = 2.0, once: bool = False, as_json: bool = False) -> int:
    """Show the running runs every ``interval`` seconds until Ctrl-C; ``once``: one table.

    ``as_json`` prints one JSON array of rows and returns (for scripts).
    """
    if as_json:
        print(json.dumps(live_rows(ws), indent=2))
        return 0
    from rich.console import Console

    tty = sys.stdout.isatty()
    from acceptrun._util.console import styled

    # A live table on a terminal draws (cursor moves): styled, its values escaped in
    # format_rows; without one, plain text through the escaping stream.
    console = Console(file=styled()) if tty else Console(width=200, highlight=False)
    if once or not tty:
        while True:  # without a terminal: one plain table per refresh, for logs and pipes
            console.print(format_rows(live_rows(ws)))
            if once:
                return 0
            time.sleep(interval)
    from rich.live import Live

    with Live(format_rows(live_rows(ws)), console=console, auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            live.update(format_rows(live_rows(ws)), refresh=True)
