"""Cost over many runs, one run's ledger as a table, and what-if projections.

The headline figure is **cost per accepted run**: everything the selected runs cost
(compute, storage, people, switching), divided by the runs that were accepted. Ledgers
are read from each record's ``ledger.json`` and rebuilt when missing or stale (an input
file changed, or the catalog now prices the run differently).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from acceptrun._util.console import format_table
from acceptrun.cost.billing import (
    billed_seconds,
    compute_cost,
    format_bytes,
    format_usd,
    storage_cost,
)
from acceptrun.cost.catalog import Catalog, Price
from acceptrun.cost.ledger import (
    LEDGER_FILE,
    PARTS,
    RESPONSIBLE,
    SCHEMA,
    build_ledger,
    ledger_inputs,
    price_of_run,
)
from acceptrun.errors import RecordError, UserError
from acceptrun.record.status import RESPONSIBILITY, RUN_LIVE, Responsibility
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.spec.model import format_duration

__all__ = [
    "claim",
    "format_by_workspace",
    "format_claim",
    "format_ledger",
    "format_projection",
    "format_summary",
    "format_waste",
    "ledger_for",
    "parse_since",
    "project",
    "select_ledgers",
    "summarize",
    "waste_by",
    "where_the_money_went",
]

# Runs still in these states have no final cost yet; totals leave them out.
LIVE = RUN_LIVE

# Plain words for each non-productive detail of the split (see acceptrun.cost.ledger).
PHRASES = {
    "wasted.lost_work": "redone work after failures",
    "wasted.failed_startup": "failed attempts' start-up before their first step",
    "wasted.failed_preflight": "runs that failed preflight",
    "idle.startup": "idle before the first step (launch, preflight, start-up, restore)",
    "idle.backoff": "idle in restart backoff between attempts",
    "idle.after_last_step": "idle after the last step",
    "idle.idle_stop": "idle until the idle limit stopped the run (limits.idle_window)",
    "idle.after_run": "the machine left up after the run",
    "idle.rounding": "rounding up to billing increments",
    "checkpoint_stall": "the training loop blocked on checkpoint staging",
}


def ledger_for(record: RunRecord, catalog: Catalog | None = None) -> dict[str, Any]:
    """The run's ledger: ``ledger.json`` when current, else built (and written) now."""
    found = None
    with contextlib.suppress(ValueError, OSError):
        found = record.read_json(LEDGER_FILE)
    if (
        isinstance(found, dict)
        and found.get("schema") == SCHEMA
        and found.get("inputs") == ledger_inputs(record)
    ):
        price = price_of_run(record, catalog)[0]
        if _price_key(None if price is None else _price_fields(price)) == _price_key(
            found.get("price")
        ):
            return found
    return build_ledger(record, catalog)


def _price_fields(price: Price) -> dict[str, Any]:
    return {
        "label": price.label,
        "price_per_hour": price.price_per_hour,
        "increment_s": price.increment_s,
        "minimum_s": price.minimum_s,
        "storage_per_gib_month": price.storage_per_gib_month,
    }


def _price_key(price: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What of a price changes a ledger's figures (a stored ledger is stale without it)."""
    if price is None:
        return None
    names = ("label", "price_per_hour", "increment_s", "minimum_s", "storage_per_gib_month")
    return tuple(price.get(k) for k in names)


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    """``--since 2026-11-01`` (or a full ISO time, or ``7d`` / ``12h`` ago) as aware UTC."""
    if re.fullmatch(r"\s*\d+(?:\.\d+)?\s*[wdhm]\s*", text):
        n, unit = float(text.strip()[:-1]), text.strip()[-1]
        ago = n * {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0}[unit]
        return (now or datetime.now(UTC)) - timedelta(seconds=ago)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(
            f"--since: {text!r} is not a date; give one like --since 2026-11-01, "
            "--since 2026-11-01T09:30 or --since 7d"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def select_ledgers(
    ws: Workspace,
    catalog: Catalog | None = None,
    *,
    since: datetime | None = None,
    spec: str | None = None,
    provider: str | None = None,
    gpu: str | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Ledgers of the workspace's ended runs that match; and the ids of live runs left out."""
    chosen, live = [], []
    for run_id in ws.run_ids():
        record = RunRecord(ws.runs_dir / run_id)
        try:
            state = record.state
        except (RecordError, ValueError):
            continue  # a damaged record has no cost to count; `acceptrun ls` shows it
        if spec is not None and state.get("name") != spec:
            continue
        if since is not None:
            created = str(state.get("created_at", ""))
            try:
                if parse_since(created) < since:
                    continue
            except UserError:
                continue
        if state.get("status") in LIVE:
            live.append(run_id)
            continue
        ledger = ledger_for(record, catalog)
        price = ledger.get("price") or {}
        if provider is not None and price.get("provider") != provider:
            continue
        if gpu is not None and gpu.lower() not in str(price.get("gpu") or "").lower():
            continue
        chosen.append(ledger)
    return chosen, live


def summarize(ledgers: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Totals over ledgers: money by kind, the compute split, runs and accepted runs."""
    keys = ("compute_usd", "storage_usd", "human_usd", "switching_usd")
    totals = dict.fromkeys(keys, 0.0)
    split_usd = dict.fromkeys(PARTS, 0.0)
    split_s = dict.fromkeys(PARTS, 0.0)
    detail_usd: dict[str, float] = {}
    detail_s: dict[str, float] = {}
    waste_usd = dict.fromkeys(RESPONSIBLE, 0.0)
    waste_s = dict.fromkeys(RESPONSIBLE, 0.0)
    runs = accepted = unpriced = 0
    billed = device = left_bytes = left_monthly = mirror_bytes = mirror_monthly = 0.0
    for ledger in ledgers:
        runs += 1
        accepted += ledger.get("accepted") is True
        unpriced += not ledger.get("priced")
        for k in keys:
            totals[k] += ledger["totals"][k]
        comp = ledger["compute"]
        per_s = comp["usd"] / ledger["billed_s"] if ledger["billed_s"] else 0.0
        for k in PARTS:
            split_usd[k] += comp["split_usd"][k]
            split_s[k] += comp["split_s"][k]
        for k, v in comp["detail_s"].items():
            detail_s[k] = detail_s.get(k, 0.0) + v
            detail_usd[k] = detail_usd.get(k, 0.0) + v * per_s
        for k in RESPONSIBLE:
            # A ledger written before a key existed ("drill") has none of it.
            waste_usd[k] += comp["waste"]["usd"].get(k, 0.0)
            waste_s[k] += comp["waste"]["seconds"].get(k, 0.0)
        billed += ledger["billed_s"]
        device += ledger["device_seconds"]
        left = ledger["storage"]["left_behind"]
        left_bytes += left["bytes"]
        left_monthly += left["monthly_usd"]
        mirror_bytes += left.get("mirror_bytes", 0)
        mirror_monthly += left.get("mirror_monthly_usd", 0.0)
    total = sum(totals.values())
    return {
        "runs": runs,
        "accepted": accepted,
        "unpriced": unpriced,
        "totals": totals,
        "total_usd": total,
        "cost_per_accepted_run": total / accepted if accepted else None,
        "billed_s": billed,
        "device_seconds": device,
        "split_usd": split_usd,
        "split_s": split_s,
        "detail_usd": detail_usd,
        "detail_s": detail_s,
        "waste_usd": waste_usd,
        "waste_s": waste_s,
        "left_behind_bytes": left_bytes,
        "left_behind_monthly_usd": left_monthly,
        "mirror_left_bytes": mirror_bytes,
        "mirror_monthly_usd": mirror_monthly,
    }


def where_the_money_went(summary: dict[str, Any]) -> str:
    """One line: the largest non-productive share of compute, in plain words.

    Shares are of compute spend in USD; when nothing is priced, of billed time.
    """
    use_usd = summary["totals"]["compute_usd"] > 0
    detail = summary["detail_usd"] if use_usd else summary["detail_s"]
    whole = summary["totals"]["compute_usd"] if use_usd else summary["billed_s"]
    of = "spend" if use_usd else "billed time"
    if whole <= 0:
        return "nothing was billed yet"
    productive = detail.get("productive", 0.0) / whole
    others = {k: v for k, v in detail.items() if k != "productive" and v > 0}
    if not others:
        return f"{productive:.0%} of {of} was productive steps"
    key = max(others, key=lambda k: others[k])
    share = others[key] / whole
    return f"{share:.0%} of {of} was {PHRASES.get(key, key)}; {productive:.0%} was productive steps"


def _usd(x: float) -> str:
    return f"${format_usd(x)}"


def format_summary(summary: dict[str, Any], *, live: Iterable[str] = ()) -> str:
    """``acceptrun cost``: totals, the split, cost per accepted run, where the money went."""
    runs, accepted = summary["runs"], summary["accepted"]
    if runs == 0:
        return "no ended runs match; start one with `acceptrun run SPEC`"
    t = summary["totals"]
    per = summary["cost_per_accepted_run"]
    lines = [
        f"{runs} run{'s' if runs != 1 else ''}, {accepted} accepted",
        f"  compute     {_usd(t['compute_usd']):>12}   billed {format_duration(summary['billed_s'])}, "
        f"{summary['device_seconds'] / 3600:.2f} GPU-hours",
        f"  storage     {_usd(t['storage_usd']):>12}   left behind {format_bytes(summary['left_behind_bytes'])} "
        f"({_usd(summary['left_behind_monthly_usd'])}/month)"
        + (
            f", in mirrors {format_bytes(summary['mirror_left_bytes'])} "
            f"({_usd(summary['mirror_monthly_usd'])}/month)"
            if summary.get("mirror_left_bytes")
            else ""
        ),
        f"  people      {_usd(t['human_usd']):>12}",
        f"  switching   {_usd(t['switching_usd']):>12}",
        f"  total       {_usd(summary['total_usd']):>12}",
        "  cost per accepted run: " + (_usd(per) if per is not None else "no accepted run yet"),
    ]
    use_usd = t["compute_usd"] > 0
    split = summary["split_usd"] if use_usd else summary["split_s"]
    whole = sum(split.values())
    if whole > 0:
        parts = ", ".join(f"{k.replace('_', ' ')} {v / whole:.0%}" for k, v in split.items())
        lines.append(f"  compute split: {parts}")
    lines.append(f"  where the money went: {where_the_money_went(summary)}")
    if sum(summary["waste_s"].values()) > 0:
        lines.append("  wasted, by whose failure: " + _waste_line(summary))
    if summary["unpriced"]:
        lines.append(
            f"  {summary['unpriced']} run(s) have no price (no [cost] in their spec): "
            "counted in time, at $0"
        )
    live = list(live)
    if live:
        lines.append(f"  {len(live)} run(s) still running, not counted: {', '.join(live[:3])}")
    return "\n".join(lines)


def _waste_line(summary: dict[str, Any]) -> str:
    use_usd = summary["totals"]["compute_usd"] > 0
    return ", ".join(
        f"{k} {_usd(summary['waste_usd'][k]) if use_usd else format_duration(summary['waste_s'][k])}"
        for k in RESPONSIBLE
    )


def _week(ledger: dict[str, Any]) -> str:
    """The ISO week a run was created in (``2026-W49``)."""
    try:
        d = datetime.fromisoformat(str(ledger.get("created_at")).replace("Z", "+00:00"))
    except ValueError:
        return "unknown"
    year, week, _ = d.isocalendar()
    return f"{year}-W{week:02d}"


def _provider(ledger: dict[str, Any]) -> str:
    return str((ledger.get("price") or {}).get("provider") or "no provider")


GROUPS: dict[str, Callable[[dict[str, Any]], str]] = {
    "run": lambda led: str(led.get("run_id")),
    "week": _week,
    "provider": _provider,
}


def waste_by(ledgers: Iterable[dict[str, Any]], group: str) -> list[dict[str, Any]]:
    """Wasted USD and seconds by responsibility, per run, week or provider (``GROUPS``)."""
    key = GROUPS[group]
    rows: dict[str, dict[str, Any]] = {}
    for led in ledgers:
        name = key(led)
        row = rows.setdefault(name, {
            group: name, "runs": 0,
            "usd": dict.fromkeys(RESPONSIBLE, 0.0), "seconds": dict.fromkeys(RESPONSIBLE, 0.0),
        })  # fmt: skip
        row["runs"] += 1
        waste = led["compute"]["waste"]
        for k in RESPONSIBLE:
            row["usd"][k] += waste["usd"].get(k, 0.0)  # an older ledger: no "drill"
            row["seconds"][k] += waste["seconds"].get(k, 0.0)
    return [rows[k] for k in sorted(rows, reverse=group == "week")]


def format_waste(ledgers: list[dict[str, Any]]) -> str:
    """``acceptrun cost --by-responsibility``: the waste split per week, provider and run."""
    lines = []
    for group in ("week", "provider", "run"):
        table = [
            (r[group], r["runs"], *(_usd(r["usd"][k]) for k in RESPONSIBLE),
             *(format_duration(r["seconds"][k]) for k in RESPONSIBLE))
            for r in waste_by(ledgers, group)
        ]  # fmt: skip
        headers = (group.upper(), "RUNS", *(f"{k.upper()} $" for k in RESPONSIBLE),
                   *(f"{k.upper()} TIME" for k in RESPONSIBLE))  # fmt: skip
        right = set(headers[1:])
        lines += [
            f"wasted, by whose failure, per {group}:",
            format_table(headers, table, right=right),
            "",
        ]
    return "\n".join(lines).rstrip()


def claim(ledgers: Iterable[dict[str, Any]], *, drills: bool = False) -> dict[str, Any]:
    """The provider-caused incidents of these ledgers: what a credit request needs.

    One row per failed attempt whose class is the provider's (record.status.RESPONSIBILITY):
    the run, when it started and ended, the class and the lines that decided it, the
    wasted time and its cost at the run's price. An injected fault (a drill) is the run's
    own doing, not the platform's: left out unless ``drills``, and marked when shown.
    """
    incidents = []
    for led in ledgers:
        price = led.get("price") or {}
        for a in led["compute"]["attempts"]:
            ev = a.get("evidence") or {}
            # A drill is booked to "drill" (an older ledger: to its class's responsibility):
            # shown with drills when its class is the provider's, never counted.
            klass = a.get("class")
            provider_class = klass in {c.value for c, r in RESPONSIBILITY.items()
                                       if r is Responsibility.PROVIDER}  # fmt: skip
            if ev.get("injected") and not (drills and provider_class):
                continue
            if not ev.get("injected") and a.get("responsibility") != "provider":
                continue
            incidents.append({
                "run_id": led["run_id"], "name": led.get("name"), "attempt": a["attempt"],
                "class": a["class"], "started_at": ev.get("started_at"),
                "ended_at": ev.get("ended_at"), "reason": ev.get("reason"),
                "evidence": ev.get("lines") or [], "injected": bool(ev.get("injected")),
                "wasted_s": a["split_s"]["wasted"], "wasted_usd": a.get("wasted_usd", 0.0),
                "attempt_usd": a["usd"], "provider": price.get("provider"),
                "instance": price.get("instance"), "price": price.get("label"),
                "priced": bool(led.get("priced")), "nodes": led.get("nodes", 1),
            })  # fmt: skip
    incidents.sort(key=lambda i: str(i["started_at"]))
    return {
        "incidents": incidents,
        "wasted_usd": round(sum(i["wasted_usd"] for i in incidents if not i["injected"]), 6),
        "wasted_s": round(sum(i["wasted_s"] for i in incidents if not i["injected"]), 3),
        "rule": "failed attempts whose failure class is the provider's ("
        + ", ".join(c.value for c, r in RESPONSIBILITY.items() if r is Responsibility.PROVIDER)
        + "); cost is each attempt's wasted time at the run's price",
    }


def format_claim(c: dict[str, Any], *, since: datetime | None = None) -> str:
    """``acceptrun cost claim``: the provider's incidents, with times, evidence and cost."""
    when = f" since {since.isoformat(timespec='minutes')}" if since else ""
    found = c["incidents"]
    if not found:
        return f"no provider-caused incidents{when}"
    n = sum(not i["injected"] for i in found)
    lines = [
        f"{n} provider-caused incident{'s' if n != 1 else ''}{when}: "
        f"{_usd(c['wasted_usd'])} wasted ({format_duration(c['wasted_s'])})",
    ]
    for i in found:
        where = " ".join(x for x in (i["provider"], i["instance"]) if x) or "no provider in [cost]"
        cost = _usd(i["wasted_usd"]) if i["priced"] else "not priced"
        drill = "  [injected by a drill: not the provider's]" if i["injected"] else ""
        lines += [
            "",
            f"{i['run_id']} ({i['name']}) attempt {i['attempt']}: {i['class']}{drill}",
            f"  from {i['started_at']} to {i['ended_at']} on {where}",
            f"  wasted {format_duration(i['wasted_s'])}, {cost}"
            + (f" ({i['nodes']} nodes)" if (i["nodes"] or 1) > 1 else ""),
            f"  why: {i['reason']}",
            *(f"  evidence: {line}" for line in i["evidence"]),
        ]
    return "\n".join(lines)


def format_by_workspace(
    rows: list[dict[str, Any]],
    total: dict[str, Any],
    *,
    live: Iterable[str] = (),
    notes: Iterable[str] = (),
) -> str:
    """``acceptrun cost --all``: one line per listed workspace, then the summary of them all."""
    headers = ("PROJECT", "RUNS", "ACCEPTED", "TOTAL", "PER ACCEPTED", "WORKSPACE")
    table = [
        (
            r["project"], r["runs"], r["accepted"], _usd(r["total_usd"]),
            "-" if r["cost_per_accepted_run"] is None else _usd(r["cost_per_accepted_run"]),
            r["workspace"],
        )
        for r in rows
    ]  # fmt: skip
    numbers = {"RUNS", "ACCEPTED", "TOTAL", "PER ACCEPTED"}
    lines = [format_table(headers, table, right=numbers)]
    lines += ["", "all listed workspaces: " + format_summary(total, live=live)]
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def format_ledger(ledger: dict[str, Any]) -> str:
    """``acceptrun cost show RUN``: one run's ledger as a small table."""
    verdict = {True: "accepted", False: "rejected", None: "no verdict"}[ledger.get("accepted")]
    price = ledger.get("price")
    head = f"run {ledger['run_id']} ({verdict})"
    if price:
        head += (
            f"  price {price['label']} {_usd(price['price_per_hour'])}/h, "
            f"increments of {price['increment_s']:g} s (source: {price['source'] or '-'})"
        )
    else:
        head += f"  not priced: {ledger.get('unpriced_reason')}"
    comp = ledger["compute"]
    lines = [
        head,
        f"billed {ledger['billed_s']:.0f} s (wall {ledger['wall_s']:.1f} s, "
        f"{len(ledger['segments'])} segment(s)), "
        + (
            f"{ledger['gpus']} GPU(s): {ledger['device_seconds']:.0f} GPU-seconds"
            if ledger.get("gpus")
            else "a CPU run: 0 GPUs, no GPU-seconds"
        ),
        f"  {'':<18} {'seconds':>10} {'USD':>12}",
    ]
    for k in PARTS:
        lines.append(
            f"  {k.replace('_', ' '):<18} {comp['split_s'][k]:>10.1f} {comp['split_usd'][k]:>12.2f}"
        )
    lines.append(f"  {'compute':<18} {ledger['billed_s']:>10.1f} {comp['usd']:>12.2f}")
    rounding = comp["detail_s"].get("idle.rounding", 0.0)
    lines.append(f"  (idle includes {rounding:.1f} s of rounding up to billing increments)")
    tail = ledger.get("after_run") or {}
    if tail.get("counted"):
        lines.append(
            f"  (idle includes {tail['seconds']:.1f} s of the machine left up after the run)"
        )
    elif tail:
        bound = tail.get("estimate_max_usd")
        est = (
            f"; launched from the SkyPilot export, at most {_usd(bound)} more (an estimate)"
            if bound
            else ""
        )
        lines.append(f"  after the run: {tail['why']}{est}")
    for a in comp["attempts"]:
        s = a["split_s"]
        lines.append(
            f"  attempt {a['attempt']:<3} {a['outcome']:<10} {a['billed_s']:>8.1f} s "
            f"{_usd(a['usd']):>10}  productive {s['productive']:.1f}, wasted {s['wasted']:.1f}, "
            f"no step {s['idle']:.1f}, stall {s['checkpoint_stall']:.2f}"
        )
        if a.get("responsibility") not in (None, "none") and s["wasted"] > 0:
            ev = a.get("evidence") or {}
            drill = ", injected" if ev.get("injected") else ""
            lines.append(
                f"      wasted {s['wasted']:.1f} s is the {a['responsibility']}'s "
                f"({a['class']}{drill}): {ev.get('reason')}"
            )
    st = ledger["storage"]
    left = st["left_behind"]
    local_usd = st.get("local_usd", st["usd"])
    lines.append(
        f"  storage here: checkpoints {st['checkpoints']['gib_hours']:.3g} GiB-h, outputs "
        f"{st['outputs']['gib_hours']:.3g} GiB-h, {_usd(local_usd)}; left behind "
        f"{format_bytes(left['bytes'])} ({_usd(left['monthly_usd'])}/month)"
    )
    mirror = st.get("mirror") or {}
    if mirror.get("items"):
        rate = "" if mirror.get("priced") else " (no cost.mirror_per_gib_month: at $0)"
        lines.append(
            f"  storage in the mirror: {mirror['gib_hours']:.3g} GiB-h, {_usd(mirror['usd'])}"
            f"{rate}; left there {format_bytes(mirror['left_bytes'])} "
            f"({_usd(mirror['monthly_usd'])}/month)"
        )
    for h in ledger["human"]:
        note = f" ({h['note']})" if h.get("note") else ""
        lines.append(
            f"  people: {h['minutes']:g} min at {_usd(h['rate_per_hour'])}/h = {_usd(h['usd'])}{note}"
        )
    for s in ledger["switching"]:
        note = f" ({s['note']})" if s.get("note") else ""
        lines.append(f"  switching: {_usd(s['usd'])}{note}")
    lines.append(f"  total {_usd(ledger['total_usd'])}")
    return "\n".join(lines)


def project(ledger: dict[str, Any], target: Price) -> dict[str, Any]:
    """The run on ``target``: the same measured wall time per segment, the target's price
    and billing rounding; storage at the target's rate; people and switching unchanged."""
    billed = sum(billed_seconds(s["start"], s["end"], target) for s in ledger["segments"])
    compute = compute_cost(billed, target)
    storage = sum(
        storage_cost(item["bytes"], item["seconds"], target.storage_per_gib_month)
        for kind in ("checkpoints", "outputs")
        for item in ledger["storage"][kind]["items"]
    )
    t = ledger["totals"]
    total = compute + storage + t["human_usd"] + t["switching_usd"]
    return {
        "projection": True,
        "rule": "same measured wall time per billing segment, at the target's price and "
        "billing rounding; the work is not rescaled to the target's GPUs",
        "run_id": ledger["run_id"],
        "target": target.label,
        "target_gpus": target.gpus,
        "run_gpus": ledger["gpus"],
        "billed_s": billed,
        "compute_usd": compute,
        "storage_usd": storage,
        "total_usd": total,
        "actual_total_usd": ledger["total_usd"],
        "actual_price": (ledger.get("price") or {}).get("label"),
    }


def format_projection(p: dict[str, Any]) -> str:
    """``acceptrun cost whatif``: clearly a projection, with its rule."""
    actual = p["actual_price"] or "no price"
    lines = [
        f"PROJECTION (not a measurement): run {p['run_id']} on {p['target']}",
        f"  rule: {p['rule']}",
        f"  billed      {p['billed_s']:.0f} s",
        f"  compute     {_usd(p['compute_usd']):>12}",
        f"  storage     {_usd(p['storage_usd']):>12}",
        f"  total       {_usd(p['total_usd']):>12}   (measured on {actual}: {_usd(p['actual_total_usd'])})",
    ]
    if p["target_gpus"] and p["target_gpus"] != p["run_gpus"]:
        lines.append(
            f"  note: the run used {p['run_gpus']} GPU(s), {p['target']} has {p['target_gpus']}; "
            "a different GPU count changes the wall time, which this projection keeps"
        )
    return "\n".join(lines)
