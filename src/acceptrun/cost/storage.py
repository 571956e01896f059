"""A run's storage in its cost ledger: checkpoints, outputs and the mirror, held over time.

:func:`storage_of` walks the record's events (checkpoint commits and deletes, mirror
uploads and deletes, outputs) for how long each item was held, prices the GiB-hours at
the spec's rates, and measures what is left behind after the run (this run's checkpoint
store and its outputs on disk, what the mirror still holds) with its monthly cost.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acceptrun.checkpoint.owner import store_root
from acceptrun.cost.billing import monthly_storage_cost, storage_cost
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec

__all__ = ["storage_of"]

GIB = float(1 << 30)


def _dir_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += (Path(dirpath) / name).lstat().st_size
            except OSError:  # removed while walking
                continue
    return total


@dataclass
class _Held:
    """What a run kept on storage, from its events: each item's bytes, from and to (unix s)."""

    checkpoints: list[dict[str, Any]]
    outputs: dict[str, dict[str, Any]]  # by name: the last output of each name
    mirrored: list[dict[str, Any]]
    open_mirror: dict[int, dict[str, Any]]  # by step: still on the mirror at the end


def _held(events: list[dict[str, Any]]) -> _Held:
    open_ckpts: dict[int, dict[str, Any]] = {}
    ckpts: list[dict[str, Any]] = []
    outputs: dict[str, dict[str, Any]] = {}
    open_mirror: dict[int, dict[str, Any]] = {}
    mirrored: list[dict[str, Any]] = []
    for ev in events:
        kind, t = ev.get("kind"), ev.get("t")
        if not isinstance(t, int | float):
            continue
        if kind == "checkpoint_commit" and isinstance(ev.get("step"), int):
            item = {"step": ev["step"], "bytes": int(ev.get("total_bytes") or 0), "from": t}
            open_ckpts[ev["step"]] = item
            ckpts.append(item)
        elif kind == "checkpoint_delete" and not ev.get("error"):
            item = open_ckpts.pop(ev.get("step"), None)  # type: ignore[arg-type]
            if item is not None:
                item["to"] = t
        elif kind == "mirror_ok" and isinstance(ev.get("step"), int):
            if ev["step"] not in open_mirror:  # uploaded again: it was there all along
                item = {"step": ev["step"], "bytes": int(ev.get("bytes") or 0), "from": t}
                open_mirror[ev["step"]] = item
                mirrored.append(item)
        elif kind == "mirror_delete":
            item = open_mirror.pop(ev.get("step"), None)  # type: ignore[arg-type]
            if item is not None:
                item["to"] = t
        elif kind == "output":
            outputs[str(ev.get("name"))] = {
                "name": str(ev.get("name")),
                "path": str(ev.get("path")),
                "bytes": int(ev.get("size") or 0),
                "from": t,
            }
    return _Held(ckpts, outputs, mirrored, open_mirror)


def _priced(items: list[dict[str, Any]], end: float, rate: float) -> dict[str, Any]:
    """GiB-hours and USD of ``items``, each held from its ``from`` to its ``to`` (or ``end``)."""
    gib_h = usd = 0.0
    for item in items:
        seconds = max(0.0, float(item.pop("to", end)) - float(item.pop("from")))
        item["seconds"] = round(seconds, 3)
        gib_h += item["bytes"] / GIB * seconds / 3600.0
        usd += storage_cost(item["bytes"], seconds, rate) if rate else 0.0
    return {"gib_hours": round(gib_h, 9), "usd": round(usd, 6), "items": items}


def storage_of(
    record: RunRecord,
    spec: RunSpec,
    events: list[dict[str, Any]],
    end: float,
    rate: float,
) -> dict[str, Any]:
    """The ledger's ``storage``: what was held, for how long, its USD; what is left behind.

    ``end``: the run's end (unix s), for items still held; ``rate``: USD per GiB-month.
    """
    held = _held(events)
    mirror_rate = float(spec.cost.mirror_per_gib_month or 0.0)
    mirror_left = sum(item["bytes"] for item in held.open_mirror.values())
    mirror = {
        "url": spec.checkpoint.mirror,
        "priced": spec.cost.mirror_per_gib_month is not None,
        "rate_per_gib_month": mirror_rate,
        **_priced(held.mirrored, end, mirror_rate),
        "left_bytes": mirror_left,
        "monthly_usd": round(monthly_storage_cost(mirror_left, mirror_rate), 6),
    }

    ckpt_root = store_root(record, spec)  # this run's store only, not all of checkpoint.dir
    left_ckpt = _dir_bytes(ckpt_root) if ckpt_root.is_dir() else 0
    left_out = 0
    for o in held.outputs.values():
        p = Path(o["path"])
        if p.is_file():
            left_out += p.stat().st_size
    c, o = _priced(held.checkpoints, end, rate), _priced(list(held.outputs.values()), end, rate)
    left = left_ckpt + left_out
    return {
        "rate_per_gib_month": rate,
        "checkpoints": c,
        "outputs": o,
        "local_usd": round(c["usd"] + o["usd"], 6),
        "mirror": mirror,
        "usd": round(c["usd"] + o["usd"] + mirror["usd"], 6),
        "left_behind": {
            "checkpoint_dir": str(ckpt_root),
            "checkpoint_bytes": left_ckpt,
            "output_bytes": left_out,
            "bytes": left,
            "monthly_usd": round(monthly_storage_cost(left, rate), 6) if rate else 0.0,
            "mirror_bytes": mirror_left,
            "mirror_monthly_usd": mirror["monthly_usd"],
        },
    }
