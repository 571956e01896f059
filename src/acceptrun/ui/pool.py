"""The queue and pool page: jobs by state, each device and what runs on it, idle share.

Read from ``<workspace>/queue/queue.sqlite`` when it exists; the board never creates it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from acceptrun.report.svg import Series, line_chart
from acceptrun.spec.model import format_duration
from acceptrun.ui.board import Board
from acceptrun.ui.pages import action_form, esc, layout, run_url

__all__ = ["queue_page"]


# ---- queue and pool ---------------------------------------------------------------------------


def queue_page(board: Board, token: str | None) -> str:
    """The board's queue and pool: per workspace, the jobs by state, the devices and what
    runs on each, and the pool's idle share over time."""
    from acceptrun.queue.db import STATES, QueueDB

    body = ["<h1>Queue and pool</h1>"]
    any_queue = False
    now = datetime.now().timestamp()
    for i, (project, ws) in enumerate(board.workspaces):
        path = ws.root / "queue" / "queue.sqlite"
        if not path.exists():
            continue
        any_queue = True
        db = QueueDB(path)
        try:
            jobs, workers = db.jobs(), db.workers()
        finally:
            db.close()
        body.append(f"<h2>{esc(project)} <span class=muted>{esc(ws.root)}</span></h2>")
        counts = {s: sum(1 for j in jobs if j.state == s) for s in STATES}
        body.append(
            '<div class="kpi">'
            + "".join(f"<div><span>{esc(s)}</span><b>{n}</b></div>" for s, n in counts.items())
            + "</div>"
        )
        body += _devices(jobs, workers, now)
        body += _idle_chart(jobs, workers, now)
        body += _jobs(i, jobs, token, now)
    if not any_queue:
        body.append(
            '<p class="note">No queue in this workspace yet. Submit a job with '
            "<code>acceptrun submit SPEC</code> and start a worker with <code>acceptrun worker</code>; "
            "this page then shows the jobs by state, the devices and what runs on each.</p>"
        )
    return layout("queue", "queue", body)


def _devices(jobs: Sequence[Any], workers: Sequence[Any], now: float) -> list[str]:
    """A row per worker's device: the job running on it, or idle; the worker's heartbeat."""
    from acceptrun.queue.db import ACTIVE

    body = ["<h3>Devices</h3>"]
    if not workers:
        return [
            *body,
            '<p class="note">No worker is running: start one with <code>acceptrun worker</code>.</p>',
        ]
    on: dict[tuple[str, int], Any] = {}
    for j in jobs:
        if j.state in ACTIVE:
            for d in j.devices:
                on[(j.kind, d)] = j
    body.append(
        "<table><tr><th>worker</th><th>host</th><th>kind</th><th>device</th><th>running</th><th>heartbeat</th></tr>"
    )
    for w in workers:
        for d in w.devices:
            busy = on.get((w.kind, d))
            what = (
                "idle" if busy is None else f"job {busy.id} {busy.name} (run {busy.run_id or '-'})"
            )
            body.append(
                f"<tr><td>{esc(w.id)}</td><td>{esc(w.host)}</td><td>{esc(w.kind)}</td>"
                f'<td class="num">{d}</td><td>{esc(what)}</td>'
                f"<td>{esc(format_duration(max(0.0, now - w.heartbeat)))} ago</td></tr>"
            )
    return [*body, "</table>"]


def _jobs(i: int, jobs: Sequence[Any], token: str | None, now: float) -> list[str]:
    """The jobs by state (the newest 200 of each), a job still to run with its cancel."""
    from acceptrun.queue.db import ACTIVE, STATES

    body = ["<h3>Jobs</h3>"]
    for state in STATES:
        subset = [j for j in jobs if j.state == state]
        if not subset:
            continue
        body.append(
            f"<h4>{esc(state)} ({len(subset)})</h4><table><tr><th>job</th><th>name</th>"
            "<th>kind</th><th>devices</th><th>run</th><th>waited</th><th>ran</th><th>note</th><th></th></tr>"
        )
        for j in subset[-200:]:
            run = f'<a href="{esc(run_url(i, j.run_id))}">{esc(j.run_id)}</a>' if j.run_id else "-"
            act = (
                action_form(f"/queue/{i}/{j.id}/cancel", "cancel", token, "danger")
                if state in ("queued", *ACTIVE)
                else ""
            )
            body.append(
                f'<tr><td class="num">{j.id}</td><td>{esc(j.name)}</td><td>{esc(j.kind)} x{j.slots}</td>'
                f"<td>{esc(','.join(map(str, j.devices)) or '-')}</td><td>{run}</td>"
                f"<td>{esc(format_duration(j.waited_s(now)))}</td><td>{esc(format_duration(j.ran_for(now)))}</td>"
                f"<td>{esc(j.note)}</td><td>{act}</td></tr>"
            )
        body.append("</table>")
    return body


def _idle_chart(jobs: Sequence[Any], workers: Sequence[Any], now: float) -> list[str]:
    """The pool's idle share per hour (per 5 minutes for a short history).

    The pool is the devices of the live workers (else every device a job ever used);
    busy time is each job's last stint, from ``started_at`` to ``ended_at`` (or now).
    """
    devices = {(w.kind, d) for w in workers for d in w.devices} or {
        (j.kind, d) for j in jobs for d in j.devices
    }
    stints = [
        (float(j.started_at), float(j.ended_at or now), len(j.devices))
        for j in jobs
        if j.started_at
    ]
    if not devices or not stints:
        return []
    start = min(s for s, _, _ in stints)
    span = max(now - start, 1.0)
    bucket = 300.0 if span <= 6 * 3600 else 3600.0
    n = min(500, math.ceil(span / bucket))
    start = now - n * bucket
    busy = [0.0] * n
    for s, e, k in stints:
        for b in range(max(0, int((s - start) // bucket)), min(n, int((e - start) // bucket) + 1)):
            lo, hi = start + b * bucket, start + (b + 1) * bucket
            busy[b] += max(0.0, min(e, hi) - max(s, lo)) * k
    cap = len(devices) * bucket
    pts = [
        ((start + (b + 0.5) * bucket - now) / 3600.0, 100.0 * max(0.0, 1 - busy[b] / cap))
        for b in range(n)
    ]
    idle = 100.0 * (1 - sum(busy) / (cap * n))
    return [
        f"<h3>Idle share over time</h3><p>{idle:.0f}% of {len(devices)} device(s) idle over the last "
        f"{esc(format_duration(n * bucket))} (each job's latest stint counts as busy).</p>",
        line_chart(
            [Series("idle share", pts, "#d97706")],
            title="Pool idle share (%)",
            x_label="hours before now",
            y_label="% idle",
            y_min=0,
            y_max=100,
        ),
    ]
