"""Cost over many runs, and one run's ledger as a table (what-if projections:
:mod:`acceptrun.cost.whatif`).

The headline figure is **cost per accepted run**: everything the selected runs cost
(compute, storage, people, switching), divided by the runs that were accepted. Over a
workspace, each run's ledger is read from the index (:func:`select_ledgers`: the digest
of its ledger.json that close wrote there, :func:`acceptrun.record.index.ledger_digest`);
one run's ledger from its record's ``ledger.json`` (:func:`ledger_for`), rebuilt when
missing or stale (an input file changed, or the catalog now prices the run differently).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from operator import itemgetter, mul
from pathlib import Path
from typing import Any, overload

from acceptrun._util.console import format_table
from acceptrun.cost.billing import (
    format_bytes,
    format_usd,
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
from acceptrun.errors import RecordError, UserError, WorkspaceError
from acceptrun.record import index
from acceptrun.record.status import RESPONSIBILITY, RUN_LIVE, Responsibility
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.spec.model import format_duration

__all__ = [
    "claim",
    "format_by_workspace",
    "format_claim",
    "format_ledger",
    "format_summary",
    "format_waste",
    "ledger_for",
    "parse_since",
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


class LedgerSet(Sequence[dict[str, Any]]):
    """Ledgers chosen from the index: their figures at hand, their digests read when asked.

    :func:`summarize` and :func:`waste_by` add up the figures (the index's columns,
    :data:`acceptrun.record.index.COST_FIGURES`) without reading a digest; those of rows
    read without them (``select_ledgers(..., figures=False)``) are added up by SQLite. An
    item is the run's digest (:func:`acceptrun.record.index.ledger_digest`), which reads
    like its ledger. The digests are read from the index on the first item asked for.
    """

    def __init__(self, rows: list[index.CostRow]) -> None:
        self.rows = rows
        self._digests: list[str] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, i: slice) -> LedgerSet: ...
    def __getitem__(self, i: int | slice) -> dict[str, Any] | LedgerSet:
        if isinstance(i, slice):
            return LedgerSet(self.rows[i])
        if self._digests is None:
            self._digests = _digests(self.rows)
        digest: dict[str, Any] = json.loads(self._digests[i])
        return digest


def _index_of(row: index.CostRow) -> str:
    """The index a row was read from (that of its record's workspace, for an older row)."""
    return row.index or str(Path(row.path).parent.parent / "index.sqlite")


def _left_in_index(rows: list[index.CostRow]) -> dict[Path, list[str]]:
    """The run ids of the rows read without their figures, by the index that holds them."""
    out: dict[str, list[str]] = {}
    for r in rows:
        if not r.figures:
            out.setdefault(_index_of(r), []).append(r.run_id)
    return {Path(where): run_ids for where, run_ids in out.items()}


def _figures_of(rows: list[index.CostRow]) -> list[tuple[float, ...]]:
    """Each row's figures: its own, else read from its index (zeros for a run gone)."""
    found: dict[str, tuple[float, ...]] = {}
    for where, run_ids in _left_in_index(rows).items():
        found.update(index.read_figures(where, run_ids))
    zero = (0.0,) * len(index.COST_FIGURES)
    return [r.figures or found.get(r.run_id, zero) for r in rows]


def _digests(rows: list[index.CostRow]) -> list[str]:
    """The digest of each row: its own, else read from its workspace's index."""
    wanted: dict[str, list[str]] = {}
    for r in rows:
        if not r.digest:
            wanted.setdefault(_index_of(r), []).append(r.run_id)
    found: dict[str, str] = {}
    for where, run_ids in wanted.items():
        found.update(index.read_digests(Path(where), run_ids))
    return [r.digest or found.get(r.run_id, "{}") for r in rows]


def _rows_of(ledgers: Iterable[dict[str, Any]]) -> list[index.CostRow]:
    """The index's rows of ledgers read from records (or a LedgerSet's own)."""
    return ledgers.rows if isinstance(ledgers, LedgerSet) else [index.cost_row(x) for x in ledgers]


def select_ledgers(
    ws: Workspace,
    catalog: Catalog | None = None,
    *,
    since: datetime | None = None,
    spec: str | None = None,
    provider: str | None = None,
    gpu: str | None = None,
    figures: bool = True,
) -> tuple[LedgerSet, list[str]]:
    """Ledgers of the workspace's ended runs that match; and the ids of live runs left out.

    Read from the index (one query): each closed run's figures and digest, written when
    its ledger.json was (:mod:`acceptrun.record.index`). A run the catalog would now
    price differently, or that has no cost row yet (an index of an older release), is
    read from its record (:func:`ledger_for`) and its row written back. Without a usable
    index, every record is read. With ``figures=False`` the figures are left in the
    index, for a view that only sums them (:func:`summarize` has SQLite add them up).
    """
    catalog = catalog if catalog is not None else _load_catalog(ws)
    chosen: list[index.CostRow] = []
    live: list[str] = []
    refreshed: list[dict[str, Any]] = []
    alike: dict[str | None, bool] = {}  # price JSON -> priced alike by the catalog now
    for row in _cost_rows(ws, figures=figures):
        if spec is not None and row.name != spec:
            continue
        if since is not None and not _created_since(row.created_at, since):
            continue
        if row.status in LIVE:
            live.append(row.run_id)
            continue
        if row.price not in alike:
            alike[row.price] = row.digest is not None and _priced_alike(row, catalog)
        if row.digest is None or not alike[row.price]:
            found = _from_record(row, catalog)
            if found is None:
                continue
            refreshed.append(found)
            row = index.cost_row(found, path=row.path)
        if provider is not None or gpu is not None:
            price = json.loads(row.price or "null") or {}
            if provider is not None and price.get("provider") != provider:
                continue
            if gpu is not None and gpu.lower() not in str(price.get("gpu") or "").lower():
                continue
        chosen.append(row)
    if refreshed and os.path.isfile(ws.index_path):
        with contextlib.suppress(sqlite3.Error, WorkspaceError, OSError):  # a cache: never fatal
            index.put_costs(ws.index_path, refreshed)
    return LedgerSet(chosen), live


def _cost_rows(ws: Workspace, *, figures: bool = True) -> list[index.CostRow]:
    """The index's rows (with their figures, or not); without a usable index, the runs'
    own rows (no digest: each is read from its record, as :meth:`Workspace.list_runs`
    says why)."""
    if os.path.lexists(ws.index_path) and not ws.index_problem():
        with contextlib.suppress(sqlite3.DatabaseError, WorkspaceError):
            return index.read_costs(ws.index_path, figures=figures)
    listed = ws.list_runs()  # rebuilds a missing index, else reads the records
    if ws.index_note is None:
        return index.read_costs(ws.index_path, figures=figures)
    return [
        index.CostRow(
            r.run_id,
            r.name,
            r.status,
            r.created_at,
            r.path,
            None,
            None,
            accepted=False,
            priced=False,
            claims=0,
            figures=(),
        )
        for r in listed
    ]


def _load_catalog(ws: Workspace) -> Catalog:
    from acceptrun.cost.catalog import load_catalog

    return load_catalog(ws.root)


def _created_since(created: str, since: datetime) -> bool:
    try:
        return parse_since(created) >= since
    except UserError:
        return False


def _priced_alike(row: index.CostRow, catalog: Catalog) -> bool:
    """Whether the catalog still prices a run as its ledger says, read without its spec.

    A price the spec sets alone (``price_per_hour``, provider "custom") and a spec with no
    ``[cost]`` owe the catalog nothing; a run the catalog could not price (its reason is
    the spec's ``cost.*`` field the catalog did not know) is checked again from its record.
    """
    price = json.loads(row.price or "null")
    if not isinstance(price, dict):
        reason = json.loads(_digests([row])[0]).get("unpriced_reason")
        return not str(reason or "").startswith("cost.")
    if price.get("source") == "spec" and price.get("provider") == "custom":
        return True
    try:
        entry = catalog.lookup(str(price.get("provider")), str(price.get("instance")))
    except UserError:  # gone from the catalog since: the record says what that means
        return False
    keys: tuple[str, ...] = ("increment_s", "minimum_s", "storage_per_gib_month")
    if price.get("source") != "spec":  # the catalog's own price: all of it must agree
        keys += ("price_per_hour",)
    return all(price.get(k) == getattr(entry, k) for k in keys)


def _from_record(row: index.CostRow, catalog: Catalog) -> dict[str, Any] | None:
    """The run's ledger from its record (built when stale), None for a damaged record."""
    record = RunRecord(row.path)
    try:
        if record.state.get("status") in LIVE:  # the index's row is older than run.json
            return None
        return ledger_for(record, catalog)
    except (RecordError, ValueError, FileNotFoundError):
        return None  # no cost to count; `acceptrun ls` shows it


# Where each summed figure goes in :func:`summarize`'s answer.
_AT = {f: i for i, f in enumerate(index.COST_FIGURES)}


def _sums(rows: list[index.CostRow]) -> tuple[list[float], list[float]]:
    """Each figure's sum over the rows, and each detail's USD (index.DETAILS): the rows
    that hold their figures added up here, column by column in the order of the runs (as
    a ledger's own sums), those left in an index added up there (index.sum_costs)."""
    cols = list(zip(*(r.figures for r in rows if r.figures), strict=True)) or [()] * len(_AT)
    sums: list[float] = [float(sum(col)) for col in cols]
    usd, billed = cols[_AT["compute.usd"]], cols[_AT["billed_s"]]
    per_s = [u / b if b else 0.0 for u, b in zip(usd, billed, strict=True)]
    detail_usd: list[float] = [sum(map(mul, cols[_AT[f]], per_s)) for f in index.DETAILS]
    n = len(sums)
    for where, run_ids in _left_in_index(rows).items():
        got = index.sum_costs(where, dict.fromkeys(run_ids, "")).get("")
        if got is not None:
            sums = [a + b for a, b in zip(sums, got[:n], strict=True)]
            detail_usd = [a + b for a, b in zip(detail_usd, got[n:], strict=True)]
    return sums, detail_usd


def summarize(ledgers: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Totals over ledgers: money by kind, the compute split, runs and accepted runs.

    The figures are added up column by column (``acceptrun cost`` over 10,000 runs has
    SQLite add them up in the index: no ledger is decoded, no figure read).
    """
    rows = _rows_of(ledgers)
    sums, usd_of = _sums(rows)

    def got(figure: str) -> float:
        return sums[_AT[figure]]

    keys = ("compute_usd", "storage_usd", "human_usd", "switching_usd")
    totals = {k: got(f"totals.{k}") for k in keys}
    detail_s = {f.removeprefix(index.DETAIL): got(f) for f in index.DETAILS}
    detail_usd = dict(zip(detail_s, usd_of, strict=True))
    total = sum(totals.values())
    accepted = sum(r.accepted for r in rows)
    left = "storage.left_behind"
    return {
        "runs": len(rows),
        "accepted": accepted,
        "unpriced": sum(not r.priced for r in rows),
        "totals": totals,
        "total_usd": total,
        "cost_per_accepted_run": total / accepted if accepted else None,
        "billed_s": got("billed_s"),
        "device_seconds": got("device_seconds"),
        "split_usd": {k: got(f"compute.split_usd.{k}") for k in PARTS},
        "split_s": {k: got(f"compute.split_s.{k}") for k in PARTS},
        "detail_usd": detail_usd,
        "detail_s": detail_s,
        "waste_usd": {k: got(f"compute.waste.usd.{k}") for k in RESPONSIBLE},
        "waste_s": {k: got(f"compute.waste.seconds.{k}") for k in RESPONSIBLE},
        "left_behind_bytes": got(f"{left}.bytes"),
        "left_behind_monthly_usd": got(f"{left}.monthly_usd"),
        "mirror_left_bytes": got(f"{left}.mirror_bytes"),
        "mirror_monthly_usd": got(f"{left}.mirror_monthly_usd"),
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


def _week(ledger: dict[str, Any] | index.CostRow) -> str:
    """The ISO week a run was created in (``2026-W49``)."""
    created = ledger.created_at if isinstance(ledger, index.CostRow) else ledger.get("created_at")
    try:
        d = datetime.fromisoformat(str(created).replace("Z", "+00:00"))
    except ValueError:
        return "unknown"
    year, week, _ = d.isocalendar()
    return f"{year}-W{week:02d}"


def _provider(ledger: dict[str, Any] | index.CostRow) -> str:
    if isinstance(ledger, index.CostRow):
        return _provider_in(ledger.price)
    return str((ledger.get("price") or {}).get("provider") or "no provider")


@functools.lru_cache(maxsize=1024)
def _provider_in(price: str | None) -> str:
    """The provider of an index row's price (JSON text: a workspace has a few of them)."""
    return str((json.loads(price or "null") or {}).get("provider") or "no provider")


def _run_id(ledger: dict[str, Any] | index.CostRow) -> str:
    return ledger.run_id if isinstance(ledger, index.CostRow) else str(ledger.get("run_id"))


def _name(ledger: dict[str, Any] | index.CostRow) -> str:
    return ledger.name if isinstance(ledger, index.CostRow) else str(ledger.get("name"))


# How a ledger (or its index row) is grouped: by run, ISO week, provider or spec name.
GROUPS: dict[str, Callable[[dict[str, Any] | index.CostRow], str]] = {
    "run": _run_id,
    "week": _week,
    "provider": _provider,
    "spec": _name,
}


def group_ledgers(ledgers: Iterable[dict[str, Any]], group: str) -> dict[str, LedgerSet]:
    """Ledgers by ``group`` (``GROUPS``), each group's figures ready to :func:`summarize`."""
    key = GROUPS[group]
    out: dict[str, list[index.CostRow]] = {}
    for row in _rows_of(ledgers):
        out.setdefault(key(row), []).append(row)
    return {name: LedgerSet(rows) for name, rows in out.items()}


# The waste figures of a row, in waste_by's order: USD by responsibility, then seconds.
_WASTE = itemgetter(
    *(_AT[f"compute.waste.{u}.{k}"] for u in ("usd", "seconds") for k in RESPONSIBLE)
)


def waste_by(ledgers: Iterable[dict[str, Any]], group: str) -> list[dict[str, Any]]:
    """Wasted USD and seconds by responsibility, per run, week or provider (``GROUPS``)."""
    key = GROUPS[group]
    rows = _rows_of(ledgers)
    found: dict[str, list[Any]] = {}  # group -> [runs, its waste figures added up in order]
    for row, figures in zip(rows, _figures_of(rows), strict=True):
        waste = _WASTE(figures)
        name = key(row)
        sums = found.get(name)
        if sums is None:
            found[name] = [1, *waste]
        else:
            sums[0] += 1
            for i, value in enumerate(waste, 1):
                sums[i] += value
    n = len(RESPONSIBLE)
    out = [
        {group: name, "runs": s[0], "usd": dict(zip(RESPONSIBLE, s[1 : n + 1], strict=True)),
         "seconds": dict(zip(RESPONSIBLE, s[n + 1 :], strict=True))}
        for name, s in found.items()
    ]  # fmt: skip
    return sorted(out, key=lambda r: r[group], reverse=group == "week")


def format_waste(ledgers: Sequence[dict[str, Any]]) -> str:
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
    lines = _ledger_head(ledger) + _compute_lines(ledger) + _storage_lines(ledger["storage"])
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


def _ledger_head(ledger: dict[str, Any]) -> list[str]:
    """The run, its verdict and its price; the time billed, and the table's header."""
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
    return [
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


def _compute_lines(ledger: dict[str, Any]) -> list[str]:
    """The compute split (a row per part), the machine after the run, and each attempt's
    split with whose its wasted time was."""
    comp = ledger["compute"]
    lines = [
        f"  {k.replace('_', ' '):<18} {comp['split_s'][k]:>10.1f} {comp['split_usd'][k]:>12.2f}"
        for k in PARTS
    ]
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
    return lines


def _storage_lines(st: dict[str, Any]) -> list[str]:
    """Storage here (checkpoints, outputs, what is left behind) and in the mirror."""
    left = st["left_behind"]
    local_usd = st.get("local_usd", st["usd"])
    lines = [
        f"  storage here: checkpoints {st['checkpoints']['gib_hours']:.3g} GiB-h, outputs "
        f"{st['outputs']['gib_hours']:.3g} GiB-h, {_usd(local_usd)}; left behind "
        f"{format_bytes(left['bytes'])} ({_usd(left['monthly_usd'])}/month)"
    ]
    mirror = st.get("mirror") or {}
    if mirror.get("items"):
        rate = "" if mirror.get("priced") else " (no cost.mirror_per_gib_month: at $0)"
        lines.append(
            f"  storage in the mirror: {mirror['gib_hours']:.3g} GiB-h, {_usd(mirror['usd'])}"
            f"{rate}; left there {format_bytes(mirror['left_bytes'])} "
            f"({_usd(mirror['monthly_usd'])}/month)"
        )
    return lines
