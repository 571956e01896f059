"""The report's data: everything ``acceptrun report RUN`` shows, read from the record.

:func:`report_data` is one plain JSON-able dict (``--format json`` prints it); the HTML
page (:mod:`acceptrun.report.html`), the Markdown report and the board's run page render
it. A closed run's data is what close wrote, so the same report comes out at any later
time.
"""

from __future__ import annotations

from typing import Any

from acceptrun._util.durable import read_jsonl
from acceptrun.capture import provenance as provmod
from acceptrun.notify.summary import delivery_rows
from acceptrun.record.liveness import supervisor_state
from acceptrun.record.status import RUN_CLOSED, RUN_LIVE
from acceptrun.record.view import RecordView
from acceptrun.record.workspace import RunRecord
from acceptrun.report.sections.serving import serving_html
from acceptrun.verdict.core import GROUPS

__all__ = ["SCHEMA", "gpu_absent", "report_data"]

SCHEMA = 1


def _verdict(record: RunRecord, view: RecordView) -> dict[str, Any]:
    """verdict.json as decided at close; a run not closed yet is decided now (and says so).

    A closed run is never decided again here: without its verdict.json it shows none.
    """
    decided = view.verdict()  # a newer format raises RecordError naming the fix
    if decided is not None:
        return {**decided.raw, "provisional": False}
    if record.state.get("status") in RUN_CLOSED:
        why = (
            f"{record.file('verdict.json')} is missing from this closed run: its verdict was "
            "decided once, at close, and is not decided again here (not accepted). Restore "
            "verdict.json from a copy of the record."
        )
        return {"accepted": False, "checks": [], "provisional": True, "provisional_why": why}
    from acceptrun.verdict.decide import compute_verdict

    why = "The run has not closed: this verdict was computed now, from the record so far."
    return {**compute_verdict(record).to_dict(), "provisional": True, "provisional_why": why}


def _checkpoints(record: RunRecord, view: RecordView) -> dict[str, Any]:
    from acceptrun.checkpoint.owner import StoreOwnedError, open_run_store, store_root

    try:
        spec = record.spec
        root = store_root(record, spec)  # checkpoint.dir/<run id>/ (or an older record's dir)
        mirror = spec.checkpoint.mirror
    except Exception:  # a spec that no longer loads: the default place
        root, mirror = record.checkpoints_dir, None
    mirror_steps = (record.read_json("mirror.json") or {}).get("steps", {})
    rows = []
    try:  # the run's own store; another run's steps are none of this run's
        store = open_run_store(record, root=root, retention=False)
        infos, latest = store.list(), store.latest()
    except StoreOwnedError:
        infos, latest = [], None
    for info in infos:
        rows.append(
            {
                "step": info.step,
                "created_at": info.created_at,
                "bytes": info.total_bytes,
                "files": len(info.files),
                "metrics": info.metrics,
                "mirror": (mirror_steps.get(str(info.step)) or {}).get("state") if mirror else None,
            }
        )
    quarantine = root / "quarantine"
    quarantined = sorted(p.name for p in quarantine.iterdir()) if quarantine.is_dir() else []
    commits = len(view.checkpoints().committed)
    return {
        "dir": str(root),
        "mirror": mirror,
        "latest": latest.step if latest else None,
        "kept": rows,
        "committed": commits,
        "quarantined": quarantined,
    }


def _lineage(record: RunRecord, prov: dict[str, Any]) -> list[dict[str, Any]]:
    """Each output with what produced it: hash, commit, GPU, driver, CUDA, torch, host."""
    git = prov.get("git") or {}
    gpus = prov.get("gpus") or {}
    torch = prov.get("torch") or {}
    host = prov.get("host") or {}
    python = prov.get("python") or {}
    names = sorted({str(d.get("name")) for d in gpus.get("devices") or []})
    out: dict[str, dict[str, Any]] = {}
    for ev in record.events("output"):
        out[str(ev.get("name"))] = {
            "name": ev.get("name"),
            "path": ev.get("path"),
            "hash": ev.get("hash"),
            "size": ev.get("size"),
            "attempt": ev.get("attempt"),
            "t": ev.get("t"),
            "commit": None if git.get("absent") else git.get("commit"),
            "dirty": None if git.get("absent") else git.get("dirty"),
            "diff_hash": git.get("diff_hash") if git.get("dirty") else None,
            "gpu": ", ".join(names) if names else None,
            "driver": gpus.get("driver"),
            "cuda": torch.get("cuda"),
            "torch": torch.get("version"),
            "python": python.get("version"),
            "host": host.get("hostname"),
        }
    return list(out.values())


def _summary_and_timelines(record: RunRecord) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    try:
        from acceptrun.telemetry.summary import load_summary

        stored = load_summary(record.path)  # summary.json of a closed run, else computed
        return stored.summary.to_dict(), stored.timelines or {}
    except Exception as exc:  # the report still shows everything else
        return {"error": f"{type(exc).__name__}: {exc}"}, {}


def _portability_data(record: RunRecord, state: dict[str, Any]) -> dict[str, Any]:
    """portability.json as written at close; a run still going is checked now (and says so).

    A closed run is never checked again here: the checkout may have changed since, and
    the verdict's exit check read what close wrote.
    """
    from acceptrun.verdict.portability import PORTABILITY_FILE, check_run, recorded_portability

    try:
        found = recorded_portability(record)
        if found is not None:
            return found.to_dict()
        if state.get("status") not in RUN_LIVE:
            why = f"not recorded at close (no {PORTABILITY_FILE})"
            return {"error": f"{why}; `acceptrun portability {record.run_id}` checks it now"}
        return {**check_run(record).to_dict(), "provisional": True}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "findings": []}


def report_data(record: RunRecord) -> dict[str, Any]:
    """Everything the report shows, as plain JSON-able data (``--format json``).

    A closed run's data is what close wrote (verdict.json, summary.json, ledger.json,
    portability.json, run.json): the same report at any later time, with no git, verdict,
    summary or ledger computed.
    """
    view = RecordView(record)  # events.jsonl and the exits, read once
    state = view.raw_state
    prov = record.read_json("provenance.json") or {}
    summary, tl = _summary_and_timelines(record)
    events = view.events("run_start", "attempt_start", "workload_start")
    origin = float(events[0]["t"]) if events else None
    metrics = view.metrics()
    per_attempt = view.per_attempt_metrics()
    portability = _portability_data(record, state)
    return {
        "schema": SCHEMA,
        "run_id": record.run_id,
        "record": str(record.path),
        "state": state,
        "supervisor": supervisor_state(record, state).to_dict(),  # record/liveness.py
        "verdict": _verdict(record, view),
        "groups": GROUPS,
        "summary": summary,
        "timelines": tl,
        "origin_t": origin,
        "gpu_absent": gpu_absent(record),
        "metrics": metrics,
        "per_attempt_metrics": per_attempt,
        "ledger": record.read_json("ledger.json"),
        "provenance": prov,
        "provenance_text": provmod.format_provenance(prov) if prov else None,
        "attempts": view.attempts(),
        "checkpoints": _checkpoints(record, view),
        "outputs": _lineage(record, prov),
        "portability": portability,
        "preflight": record.read_json("preflight.json"),
        "inference": record.read_json("inference.json"),  # batch inference runs only
        "campaign": record.read_json("campaign.json"),  # a campaign's reference run only
        "serving_html": serving_html(record),  # serving runs only: figures and charts
        "notify": delivery_rows(view.events("notify")),  # notify/: deliveries, time to detect
    }


def gpu_absent(record: RunRecord) -> str | None:
    """Why the samplers saw no GPU (the first gpu_absent line of telemetry.jsonl), or None."""
    for sample in read_jsonl(record.telemetry_path):
        if sample.get("kind") == "gpu_absent":
            return str(sample.get("reason") or "no NVIDIA GPU")
    return None
