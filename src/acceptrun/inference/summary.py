"""A batch inference run at close: coverage, throughput, latency, cost per item, checks.

Reads only the record (shard manifests, events, ledger.json), the input and the output
files. Definitions (docs/inference.md, "Batch inference"):

- coverage: input items with exactly one outcome (one output line in a committed shard
  whose outputs file still has its recorded hash, or one failure listed in a committed
  manifest), divided by the input's items;
- error rate: input items listed as failed, divided by the input's items;
- items/s: items handled (outputs and failures) divided by the attempts' wall time
  (attempt_start to attempt_exit, summed: loading the model counts, restart waits do
  not); tokens/s likewise from the tokens shards reported;
- latency per item: each shard's seconds (handed out to commit) divided by its items,
  or the per-item latencies it gave; p50/p90/p99 by nearest rank over items;
- cost per 1,000 items: the ledger's total USD x 1000 / items with an output; cost per
  million tokens: total USD x 1e6 / tokens reported.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.durable import read_json, write_json_atomic
from acceptrun._util.hashing import hash_file
from acceptrun._util.units import format_latency
from acceptrun.record.glossary import WALL_THROUGHPUT
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec
from acceptrun.workload.batch import manifest_dir
from acceptrun.workload.items import iter_items

__all__ = ["batch_checks", "percentile", "summarize_batch", "write_batch_manifest"]

MAX_LISTED = 20  # missing, duplicated or failed ids listed by name in the summary


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile ``q`` (0-100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _attempt_seconds(record: RunRecord) -> float:
    """Wall seconds of the attempts: each attempt_start to its attempt_exit."""
    total, start = 0.0, None
    for ev in record.events("attempt_start", "attempt_exit"):
        if ev["kind"] == "attempt_start":
            start = ev.get("t")
        elif start is not None and isinstance(ev.get("t"), int | float):
            total += float(ev["t"]) - float(start)
            start = None
    return total


def summarize_batch(record: RunRecord, spec: RunSpec) -> dict[str, Any] | None:
    """The figures of a batch run (see the module docstring); None when it is not one."""
    inf = spec.inference
    if not inf.enabled or inf.input is None:
        return None
    source, output_dir = spec.resolve_path(inf.input), Path(spec.resolve_path(inf.output))
    out: dict[str, Any] = {"input": source, "output": str(output_dir), "shard_size": inf.shard_size}
    try:
        input_ids = [it.id for it in iter_items(source, fmt=inf.format, id_field=inf.id_field)]
    except Exception as exc:  # an unreadable input: coverage is then not recorded
        out["error"] = f"cannot read the input: {exc}"
        return out
    read = _read_shards(manifest_dir(record.path), output_dir)
    outcomes, failed, tokens = read.outcomes, read.failed, read.tokens
    expected = Counter(_hashable(i) for i in input_ids)
    missing = [i for i in expected if outcomes[i] == 0]
    duplicated = [i for i in expected if outcomes[i] > 1]
    unknown = [i for i in outcomes if i not in expected]
    total = len(input_ids)
    exact = sum(1 for i in expected if outcomes[i] == 1)
    n_failed = len(failed)
    handled = sum(outcomes[i] for i in expected)
    with_output = handled - n_failed
    seconds = _attempt_seconds(record)
    out.update(
        items=total,
        shards_total=math.ceil(total / inf.shard_size) if total else 0,
        shards_committed=len(read.shards),
        outputs=with_output,
        failed=n_failed,
        missing=len(missing),
        duplicated=len(duplicated),
        unknown=len(unknown),
        coverage=exact / total if total else 1.0,
        error_rate=n_failed / total if total else 0.0,
        seconds=round(seconds, 3),
        items_per_s=handled / seconds if seconds > 0 else None,
        tokens=tokens,
        tokens_per_s=tokens / seconds if tokens is not None and seconds > 0 else None,
        latency_p50=percentile(read.latencies, 50),
        latency_p90=percentile(read.latencies, 90),
        latency_p99=percentile(read.latencies, 99),
        bad_shards=read.bad,
        missing_ids=missing[:MAX_LISTED],
        duplicated_ids=duplicated[:MAX_LISTED],
        failed_items=failed[:MAX_LISTED],
        shards=read.shards,
    )
    ledger = record.read_json("ledger.json")
    usd = None
    if isinstance(ledger, dict) and ledger.get("priced"):
        usd = float(ledger.get("total_usd") or 0.0)
    out["usd"] = usd
    out["usd_per_1k_items"] = usd * 1000 / with_output if usd is not None and with_output else None
    out["usd_per_million_tokens"] = usd * 1e6 / tokens if usd is not None and tokens else None
    return out


@dataclass
class _Shards:
    """What a batch run's committed shards hold (:func:`_read_shards`)."""

    outcomes: Counter[Any] = field(default_factory=Counter)  # times each item id was handled
    failed: list[dict[str, Any]] = field(default_factory=list)  # the items that failed
    shards: list[dict[str, Any]] = field(default_factory=list)  # a row per intact shard
    bad: list[str] = field(default_factory=list)  # why each other shard does not count
    latencies: list[float] = field(default_factory=list)  # seconds per item
    tokens: int | None = None  # None when no shard counted its tokens


def _read_shards(manifests: Path, output_dir: Path) -> _Shards:
    """Read every shard manifest and the output file it commits; a shard whose file is
    missing or changed since its commit counts as bad, not as handled items."""
    read = _Shards()
    for path in sorted(manifests.glob("shard-*.json")):
        m = read_json(path)
        if not isinstance(m, dict):
            read.bad.append(f"{path.name}: unreadable manifest")
            continue
        file = output_dir / str(m.get("file"))
        try:
            digest, size = hash_file(file)
        except OSError:
            read.bad.append(f"shard {m.get('shard')}: {file} is missing")
            continue
        if digest != m.get("hash"):
            read.bad.append(f"shard {m.get('shard')}: {file} changed since its commit")
            continue
        with open(file, "rb") as f:
            for line in f:
                read.outcomes[_hashable(json.loads(line)["id"])] += 1
        for entry in m.get("failed") or []:
            read.outcomes[_hashable(entry.get("id"))] += 1
            read.failed.append(entry)
        n = int(m.get("items") or 0)
        if isinstance(m.get("latencies"), list):
            read.latencies += [float(x) for x in m["latencies"]]
        elif n:
            read.latencies += [float(m.get("seconds") or 0.0) / n] * n
        if isinstance(m.get("tokens"), int | float):
            read.tokens = (read.tokens or 0) + int(m["tokens"])
        read.shards.append(
            {k: m.get(k) for k in ("shard", "file", "hash", "items", "outputs", "rank", "attempt")}
            | {"bytes": size, "failed": len(m.get("failed") or [])}
        )
    return read


def _hashable(value: Any) -> Any:
    return value if isinstance(value, str | int) else json.dumps(value, sort_keys=True)


def write_batch_manifest(record: RunRecord, spec: RunSpec) -> dict[str, Any] | None:
    """``inference.json`` in the record (the figures and every committed shard with its
    hash) and a copy as ``MANIFEST.json`` in the output directory; None for other runs."""
    summary = summarize_batch(record, spec)
    if summary is None:
        return None
    record.write_json("inference.json", summary)
    output_dir = Path(str(summary["output"]))
    if output_dir.is_dir():
        manifest = {
            "run_id": record.run_id,
            "input": summary.get("input"),
            "items": summary.get("items"),
            "coverage": summary.get("coverage"),
            "shards": summary.get("shards", []),
        }
        write_json_atomic(output_dir / "MANIFEST.json", manifest)
    return summary


def batch_checks(
    record: RunRecord, spec: RunSpec
) -> list[tuple[str, str, str, bool, str, str | None]]:
    """The verdict's checks of a batch run as ``(group, name, status, required, evidence,
    fix)``; the verdict (verdict/checks/results.py) wraps them in its Check. Empty for other runs."""
    if not spec.inference.enabled:
        return []
    inf = spec.inference
    s = record.read_json("inference.json")
    if not isinstance(s, dict):
        s = summarize_batch(record, spec) or {}
    if "error" in s:
        return [("results", "coverage", "not_recorded", True, str(s["error"]),
                 "make inference.input readable again, then `acceptrun report RUN`")]  # fmt: skip
    total = int(s.get("items") or 0)
    out: list[tuple[str, str, str, bool, str, str | None]] = []
    cov = float(s.get("coverage") or 0.0)
    ok = cov >= inf.min_coverage - 1e-12
    text = (
        f"{cov:.2%} of {total:,} items have exactly one outcome ({s.get('outputs', 0):,} outputs, "
        f"{s.get('failed', 0):,} failed; missing {s.get('missing', 0)}, duplicated "
        f"{s.get('duplicated', 0)}); at least {inf.min_coverage:.2%}"
    )
    if s.get("bad_shards"):
        text += f"; not counted: {'; '.join(s['bad_shards'][:3])}"
    fix = None
    if not ok:
        fix = (
            "resume the run (`acceptrun resume RUN`) to finish its shards; missing ids: "
            f"{s.get('missing_ids', [])[:5]}"
        )
    out.append(("results", "coverage", "pass" if ok else "fail", True, text, fix))
    rate = float(s.get("error_rate") or 0.0)
    examples = "; ".join(
        f"{e.get('id')!r}: {e.get('error')}" for e in (s.get("failed_items") or [])[:2]
    )
    rate_text = f"{rate:.2%} of items failed ({s.get('failed', 0):,})"
    rate_text += f", e.g. {examples}" if examples else ""
    if inf.max_error_rate is None:
        out.append(
            ("results", "error rate", "pass", False, rate_text + " (no limit in the spec)", None)
        )
    else:
        ok = rate <= inf.max_error_rate + 1e-12
        out.append((
            "results", "error rate", "pass" if ok else "fail", True,
            f"{rate_text}, at most {inf.max_error_rate:.2%}",
            None if ok else "the failed items are listed in inference.json with their errors",
        ))  # fmt: skip
    ips = s.get("items_per_s")
    tps = s.get("tokens_per_s")
    p50, p90, p99 = s.get("latency_p50"), s.get("latency_p90"), s.get("latency_p99")
    # Wall throughput (record/glossary.py): over the attempts' wall time, not model time.
    speed = "-" if ips is None else f"{WALL_THROUGHPUT} {ips:,.1f} items/s over the attempts"
    if tps is not None:
        speed += f", {tps:,.0f} tokens/s"
    if p50 is not None:
        speed += f"; latency per item p50 {format_latency(p50)}, p90 {format_latency(p90)}, p99 {format_latency(p99)}"
    if inf.min_items_per_s is None:
        out.append(("performance", "items/s", "pass" if ips is not None else "not_recorded",
                    False, speed + " (no minimum in the spec)", None))  # fmt: skip
    else:
        ok = ips is not None and ips >= inf.min_items_per_s
        out.append((
            "performance", "items/s", "pass" if ok else ("fail" if ips is not None else "not_recorded"),
            True, f"{speed}; at least {inf.min_items_per_s:g} items/s",
            None if ok else "find the slow part in `acceptrun show RUN`, or lower inference.min_items_per_s",
        ))  # fmt: skip
    out += _cost_checks(inf, s)
    return out


def _cost_checks(inf: Any, s: dict[str, Any]) -> list[tuple[str, str, str, bool, str, str | None]]:
    out: list[tuple[str, str, str, bool, str, str | None]] = []
    for name, key, limit, unit in (
        ("cost per 1k items", "usd_per_1k_items", inf.max_usd_per_1k_items, "1,000 items"),
        ("cost per 1M tokens", "usd_per_million_tokens", inf.max_usd_per_million_tokens, "million tokens"),
    ):  # fmt: skip
        value = s.get(key)
        if value is None:
            if limit is not None:
                why = "no priced ledger.json" if s.get("usd") is None else "nothing to divide by"
                if key == "usd_per_million_tokens" and s.get("tokens") is None:
                    why = "no shard reported tokens (shard.commit(outputs, tokens=N))"
                out.append(("operations", name, "not_recorded", True, why,
                            "set cost.price_per_hour (or provider/instance) and report the counts"))  # fmt: skip
            continue
        text = f"{value:.6g} USD per {unit} ({s.get('usd', 0):.4f} USD in all)"
        if limit is None:
            out.append(
                ("operations", name, "pass", False, text + " (no maximum in the spec)", None)
            )
            continue
        ok = value <= limit + 1e-12
        out.append((
            "operations", name, "pass" if ok else "fail", True, f"{text}; at most {limit:g}",
            None if ok else "make the items cheaper (batching, a smaller model, a cheaper machine)",
        ))  # fmt: skip
    return out
