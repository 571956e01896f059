"""The resilience campaign on the demo, repeated: per kind, how well and how fast.

    python bench/campaign.py                      # examples/campaign, every kind, 3 times
    python bench/campaign.py --repeats 1 --kinds sigkill,nan --root /tmp/cb

Runs ``acceptrun drill --campaign`` (run/drills/campaign) ``--repeats`` times on the spec
(default examples/campaign/spec.toml, a NumPy loop of 40 steps) and prints, per kind:
tried, named right (of the repeats), detection median and max (the fault's event to the
attempt's recorded exit), lost steps (median), recovery median (the exit to the next
attempt's first step beyond the reference's start-up), then the share of the campaign's
compute lost (the failed attempts' lost seconds over all attempts' seconds, references
included) and one JSON line with the same figures. Exit status 1 when a kind tried was
named wrong or a run ended elsewhere than its reference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def _fmt(x: Any, unit: str = "") -> str:
    return "-" if x is None else f"{x:.2f}{unit}" if isinstance(x, float) else f"{x}{unit}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "examples" / "campaign" / "spec.toml")
    parser.add_argument("--kinds", help="comma-separated kinds (default: every kind)")
    parser.add_argument("--repeats", type=int, default=3, help="campaigns to run (3)")
    parser.add_argument("--root", type=Path, help="the workspace (default: a new temp dir)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: expected 1 or more")
    # The demo's command is `python`, looked up on PATH: this interpreter's first.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

    from acceptrun.errors import UserError
    from acceptrun.run.drills.campaign import default_campaign, parse_campaign, run_campaign

    try:
        campaign = (
            parse_campaign(f"kinds = {json.dumps(args.kinds.split(','))}", source="--kinds")
            if args.kinds
            else default_campaign()
        )
    except UserError as exc:
        parser.error(str(exc))
    root = args.root or Path(tempfile.mkdtemp(prefix="campaign-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    reports = [
        run_campaign(args.spec, campaign, workspace=root / ".acceptrun")
        for _ in range(args.repeats)
    ]
    wall = time.perf_counter() - t0
    return _print(reports, wall)


def _print(reports: list[Any], wall: float) -> int:
    rows: list[dict[str, Any]] = []
    names = [k.kind for k in reports[0].kinds]
    print(f"{'kind':<19} {'family':<12} {'tried':>5} {'right':>5} {'det med':>8} {'det max':>8} "
          f"{'lost':>5} {'rec med':>8}  final")  # fmt: skip
    for name in names:
        got = [next(k for k in r.kinds if k.kind == name) for r in reports]
        tried = [k for k in got if k.tried]
        detect = [k.detect_s for k in tried if k.detect_s is not None]
        lost = [k.lost_steps for k in tried if k.lost_steps is not None]
        recover = [k.recover_s for k in tried if k.recover_s is not None]
        row = {
            "kind": name,
            "family": got[0].family,
            "tried": len(tried),
            "named_right": sum(1 for k in tried if k.named_right),
            "detect_s_median": _median(detect),
            "detect_s_max": round(max(detect), 3) if detect else None,
            "lost_steps_median": _median([float(x) for x in lost]),
            "recover_s_median": _median(recover),
            "final_state": sorted({k.final_state for k in tried}) or ["not tried"],
            "why_not_tried": None if tried else got[0].why_not_tried,
        }
        rows.append(row)
        if not tried:
            print(
                f"{name:<19} {row['family']:<12} {0:>5} {'-':>5}  not tried: {row['why_not_tried']}"
            )
            continue
        print(
            f"{name:<19} {row['family']:<12} {row['tried']:>5} {row['named_right']:>5} "
            f"{_fmt(row['detect_s_median'], 's'):>8} {_fmt(row['detect_s_max'], 's'):>8} "
            f"{_fmt(row['lost_steps_median']):>5} {_fmt(row['recover_s_median'], 's'):>8}  "
            f"{','.join(row['final_state'])}"
        )
    compute = sum(
        r.reference_compute_s + sum(k.compute_s for k in r.kinds if k.tried) for r in reports
    )
    lost_s = sum(k.lost_s for r in reports for k in r.kinds if k.tried)
    share = lost_s / compute if compute else 0.0
    tried = sum(r.tried for r in reports)
    right = sum(r.named_right for r in reports)
    print(
        f"campaigns {len(reports)}: kinds tried {tried}, named right {right}; compute lost "
        f"{100 * share:.1f}% ({lost_s:.1f} s of {compute:.1f} s of attempts); wall {wall:.1f} s"
    )
    figures = {"campaigns": len(reports), "tried": tried, "named_right": right,
               "lost_share": round(share, 4), "compute_s": round(compute, 3),
               "wall_s": round(wall, 1), "kinds": rows}  # fmt: skip
    print(json.dumps(figures))
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
