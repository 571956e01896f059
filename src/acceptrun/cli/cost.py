"""``acceptrun cost``: totals, and its actions show, add, claim, whatif and prices (the
catalog; ``acceptrun prices`` is its old name, kept for a release)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from acceptrun._util.argtypes import MAX_DURATION_S, finite_float, text, usd
from acceptrun._util.console import get_logger
from acceptrun.cli.main import OLD_NAME
from acceptrun.cli.record import add_run_argument, find, listed_workspaces
from acceptrun.errors import AcceptrunError

__all__ = ["register"]

_log = get_logger(__name__)
_say = _log.info


def cmd_prices(args: argparse.Namespace) -> int:
    from acceptrun.cost.catalog import format_prices, load_catalog
    from acceptrun.record.lookup import workspace_of

    root = None
    try:
        root = workspace_of(args).root
    except AcceptrunError:  # no workspace: the packaged catalog alone
        root = None
    print(format_prices(load_catalog(root)))
    return 0


def cmd_cost(args: argparse.Namespace) -> int:
    from acceptrun.cost.catalog import load_catalog
    from acceptrun.cost.report import (
        format_summary,
        format_waste,
        parse_since,
        select_ledgers,
        summarize,
        waste_by,
    )
    from acceptrun.record.lookup import workspace_of

    since = parse_since(args.since) if args.since else None
    if args.all:
        return cmd_cost_all(args, since)
    ws = workspace_of(args)
    # The totals are added up in the index; the split per run, week and provider
    # (--by-responsibility, in text or JSON) reads each run's figures.
    split = args.by_responsibility
    ledgers, live = select_ledgers(
        ws, load_catalog(ws.root), since=since,
        spec=args.spec, provider=args.provider, gpu=args.gpu, figures=split,
    )  # fmt: skip
    summary = summarize(ledgers)
    if args.json:
        out = {**summary, "live": live}
        if split:
            out["waste_by"] = {g: waste_by(ledgers, g) for g in ("week", "provider", "run")}
        print(json.dumps(out, indent=2))
    else:
        print(format_summary(summary, live=live))
        if args.by_responsibility and ledgers:
            print("\n" + format_waste(ledgers))
    return 0


def cmd_cost_claim(args: argparse.Namespace) -> int:
    from acceptrun.cost.catalog import load_catalog
    from acceptrun.cost.report import claim, format_claim, parse_since, select_ledgers
    from acceptrun.record.lookup import workspace_of

    since = parse_since(args.since) if args.since else None
    ws = workspace_of(args)
    ledgers, live = select_ledgers(
        ws, load_catalog(ws.root), since=since, provider=args.provider, figures=False
    )
    found = claim(ledgers, drills=args.drills)
    if args.json:
        print(json.dumps({**found, "since": since.isoformat() if since else None, "live": live},
                         indent=2))  # fmt: skip
    else:
        print(format_claim(found, since=since))
        if live:
            print(f"{len(live)} run(s) still running, not counted: {', '.join(live[:3])}")
    return 0


def cmd_cost_all(args: argparse.Namespace, since: Any) -> int:
    from acceptrun.cost.catalog import load_catalog
    from acceptrun.cost.report import LedgerSet, format_by_workspace, select_ledgers, summarize

    workspaces, notes = listed_workspaces()
    rows: list[dict[str, Any]] = []
    every: list[Any] = []  # each workspace's index rows: summed without decoding a ledger
    live: list[str] = []
    for project, ws in workspaces:
        try:
            ledgers, running = select_ledgers(
                ws, load_catalog(ws.root), since=since,
                spec=args.spec, provider=args.provider, gpu=args.gpu, figures=False,
            )  # fmt: skip
        except (AcceptrunError, OSError) as exc:
            notes.append(f"skipped {ws.root} ({project}): {exc}")
            continue
        rows.append({"project": project, "workspace": str(ws.root), **summarize(ledgers)})
        every += ledgers.rows
        live += running
    total = summarize(LedgerSet(every))
    if args.json:
        print(
            json.dumps({"workspaces": rows, "total": total, "live": live, "notes": notes}, indent=2)
        )
    else:
        print(format_by_workspace(rows, total, live=live, notes=notes))
    return 0


def cmd_cost_add(args: argparse.Namespace) -> int:
    from acceptrun.cost.catalog import load_catalog
    from acceptrun.cost.ledger import add_costs, build_ledger
    from acceptrun.cost.report import parse_since

    found = find(args, args.run)
    ws, record = found.workspace, found.record
    stopped = args.machine_stopped_at
    stopped_at = parse_since(stopped).timestamp() if stopped else None
    add_costs(
        record, human_minutes=args.human_minutes, rate_per_hour=args.rate,
        switching_usd=args.switching_usd, machine_stopped_at=stopped_at, note=args.note,
    )  # fmt: skip
    ledger = build_ledger(record, load_catalog(ws.root))
    t = ledger["totals"]
    tail = ledger["after_run"]
    booked = f", machine after the run {tail['seconds']:.0f} s" if tail["counted"] else ""
    print(
        f"{record.run_id}: people ${t['human_usd']:,.2f}, switching ${t['switching_usd']:,.2f}"
        f"{booked}, total ${ledger['total_usd']:,.2f}"
    )
    return 0


def cmd_cost_show(args: argparse.Namespace) -> int:
    from acceptrun.cost.catalog import load_catalog
    from acceptrun.cost.report import format_ledger, ledger_for

    found = find(args, args.run)  # priced by its own workspace's catalog
    ledger = ledger_for(found.record, load_catalog(found.workspace.root))
    print(json.dumps(ledger, indent=2) if args.json else format_ledger(ledger))
    return 0


def cmd_cost_whatif(args: argparse.Namespace) -> int:
    from acceptrun.cost.catalog import load_catalog
    from acceptrun.cost.report import ledger_for
    from acceptrun.cost.whatif import format_projection, project
    from acceptrun.errors import UserError

    found = find(args, args.run)
    ws, record = found.workspace, found.record
    provider, sep, instance = args.on.partition(":")
    if not sep or not provider or not instance:
        raise UserError(
            f"--on: {args.on!r} is not PROVIDER:INSTANCE; e.g. --on lambda:gpu_1x_h100_sxm5 "
            "(`acceptrun cost prices` lists them)"
        )
    catalog = load_catalog(ws.root)
    target = catalog.lookup(provider, instance)
    projection = project(ledger_for(record, catalog), target)
    print(json.dumps(projection, indent=2) if args.json else format_projection(projection))
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    cost = sub.add_parser("cost", help="what runs cost: totals, per accepted run; whatif; prices")
    cost.add_argument(
        "--since",
        type=text(most=100),
        metavar="WHEN",
        help="runs created on or after WHEN (2026-11-01, or 7d ago)",
    )
    cost.add_argument("--spec", type=text(), metavar="NAME", help="runs of the spec with this name")
    cost.add_argument("--provider", type=text(), metavar="P", help="runs priced on this provider")
    cost.add_argument("--gpu", type=text(), metavar="G", help="runs on this GPU model (e.g. H100)")
    cost.add_argument(
        "--all", action="store_true", help="every workspace in the user's list, by project"
    )
    cost.add_argument(
        "--by-responsibility",
        action="store_true",
        help="wasted spend by whose failure (provider, workload, unknown) per week, provider, "
        "run (with --json: under waste_by)",
    )
    cost.add_argument("--json", action="store_true")
    cost.set_defaults(func=cmd_cost)
    cost_sub = cost.add_subparsers(dest="cost_command", metavar="ACTION")
    cadd = cost_sub.add_parser(
        "add", help="add people's time, a switching cost or the machine's stop time to a run"
    )
    add_run_argument(cadd)
    cadd.add_argument(
        "--human-minutes",
        type=finite_float(least=0.0, most=MAX_DURATION_S / 60, example="45"),
        metavar="MIN",
        help="minutes people spent",
    )
    cadd.add_argument("--rate", type=usd, metavar="USD", help="their rate in USD per hour")
    cadd.add_argument("--switching-usd", type=usd, metavar="USD", help="a one-off cost in USD")
    cadd.add_argument(
        "--machine-stopped-at",
        type=text(most=100),
        metavar="WHEN",
        help="when the run's machine was known to stop (2026-12-04T23:10Z, or 30m ago): "
        "the time after the run is booked as idle",
    )
    cadd.add_argument("--note", type=text(), help="what it was for")
    cadd.set_defaults(func=cmd_cost_add)
    cshow = cost_sub.add_parser("show", help="one run's cost ledger")
    add_run_argument(cshow, default="latest")
    cshow.add_argument("--json", action="store_true")
    cshow.set_defaults(func=cmd_cost_show)
    cclaim = cost_sub.add_parser(
        "claim", help="provider-caused incidents with times, evidence and cost (a credit request)"
    )
    cclaim.add_argument(
        "--since",
        type=text(most=100),
        metavar="WHEN",
        help="runs created since WHEN (7d, 2026-11-01)",
    )
    cclaim.add_argument("--provider", type=text(), metavar="P", help="runs priced on this provider")
    cclaim.add_argument(
        "--drills", action="store_true", help="also list injected faults (marked; not claimable)"
    )
    cclaim.add_argument("--json", action="store_true")
    cclaim.set_defaults(func=cmd_cost_claim)
    cwhat = cost_sub.add_parser(
        "whatif", help="project a run's cost on another instance (same wall time)"
    )
    add_run_argument(cwhat)
    cwhat.add_argument("--on", required=True, type=text(), metavar="PROVIDER:INSTANCE")
    cwhat.add_argument("--json", action="store_true")
    cwhat.set_defaults(func=cmd_cost_whatif)
    prices_help = "the price catalog: instances, prices, billing rules"
    cost_sub.add_parser("prices", help=prices_help).set_defaults(func=cmd_prices)
    # The name before `cost prices`, kept for a release: no help= keeps it out of the list.
    old = sub.add_parser("prices", description=f"{OLD_NAME % 'cost prices'} The {prices_help[4:]}.")
    old.set_defaults(func=cmd_prices, renamed="cost prices")
