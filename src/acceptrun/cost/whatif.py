"""What a run would have cost on another instance: ``acceptrun cost whatif``.

A projection, labelled as one: the run's measured wall time per billing segment at the
target's price and billing rounding; storage at the target's rate; people and switching
as they were. The work is not rescaled to the target's GPUs.
"""

from __future__ import annotations

from typing import Any

from acceptrun.cost.billing import billed_seconds, compute_cost, format_usd, storage_cost
from acceptrun.cost.catalog import Price

__all__ = ["format_projection", "project"]


def _usd(x: float) -> str:
    return f"${format_usd(x)}"


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
