"""Run the fuzzers with many cases and count what they tried and found.

    python bench/fuzz_campaign.py                 # deep profile, every target
    python bench/fuzz_campaign.py --json          # one JSON line (bench/chaos.py reads it)
    python bench/fuzz_campaign.py --profile ci --targets spec,checkpoint

Targets (the tests they run):

- ``spec``: tests/unit/test_fuzz_spec.py, any TOML structure, junk in every key, raw text
  and file bytes through ``parse_spec``/``load_spec`` and ``acceptrun spec check``;
- ``checkpoint``: tests/unit/test_fuzz_checkpoint.py, byte flips, truncations, junk,
  emptied and deleted files in every file of a committed checkpoint;
- ``record``: tests/integration/test_fuzz_record.py, every reading command on every
  damaged file of a real run record (one real run first, then in-process commands);
- ``hostile``: tests/integration/test_hostile_input.py, hostile names, ids and paths.

The ``deep`` Hypothesis profile (registered in tests/conftest.py) tries thousands of
cases per property; ``ci`` is the suite's own size; ``smoke`` (5 cases) only proves that
this script runs (its smoke test in tests/integration/bench_smoke.py). Prints, per target, the cases tried
and the failed tests; for checkpoints, corruptions tried, detected and restored from.
Exit status 1 when any test failed or a corruption went undetected.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {
    "spec": "tests/unit/test_fuzz_spec.py",
    "checkpoint": "tests/unit/test_fuzz_checkpoint.py",
    "record": "tests/integration/test_fuzz_record.py",
    "hostile": "tests/integration/test_hostile_input.py",
}


class _Tally:
    """A pytest plugin: test outcomes per file, and each fuzz module's FUZZ_COUNTS."""

    def __init__(self) -> None:
        self.outcomes: dict[str, dict[str, int]] = {}
        self.counts: dict[str, dict[str, int]] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            path = report.nodeid.split("::")[0]
            tally = self.outcomes.setdefault(path, {"passed": 0, "failed": 0, "skipped": 0})
            tally[report.outcome] += 1

    def pytest_sessionfinish(self, session: Any) -> None:
        for module in list(sys.modules.values()):
            counts = getattr(module, "FUZZ_COUNTS", None)
            where = getattr(module, "__file__", None) or ""
            if isinstance(counts, dict) and where:
                rel = Path(where).resolve().relative_to(ROOT).as_posix()
                self.counts[rel] = dict(counts)


def run(targets: list[str], profile: str) -> dict[str, Any]:
    os.environ["HYPOTHESIS_PROFILE"] = profile
    import pytest

    tally = _Tally()
    started = time.monotonic()
    paths = [str(ROOT / TARGETS[t]) for t in targets]
    args = ["-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT), *paths]
    code = pytest.main(args, plugins=[tally])
    out: dict[str, Any] = {"profile": profile, "targets": {}}
    for name in targets:
        path = TARGETS[name]
        outcomes = tally.outcomes.get(path, {})
        counts = tally.counts.get(path, {})
        entry: dict[str, Any] = {
            "tests": sum(outcomes.values()),
            "failures": outcomes.get("failed", 0),
            "cases": sum(v for k, v in counts.items() if k not in ("detected", "restored")),
            "counts": counts,
        }
        out["targets"][name] = entry
    ck = tally.counts.get(TARGETS["checkpoint"], {})
    out["checkpoint_corruptions"] = {
        "tried": ck.get("tried", 0),
        "detected": ck.get("detected", 0),
        "restored": ck.get("restored", 0),
    }
    out["failures"] = sum(e["failures"] for e in out["targets"].values())
    out["pytest_exit"] = int(code)
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--profile", default="deep", help="Hypothesis profile: deep (default), ci, smoke"
    )
    parser.add_argument(
        "--targets", default=",".join(TARGETS), help=f"comma-separated: {', '.join(TARGETS)}"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    targets = [t for t in args.targets.split(",") if t]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        parser.error(f"unknown targets {unknown}; choose from {', '.join(TARGETS)}")
    figures = run(targets, args.profile)
    ck = figures["checkpoint_corruptions"]
    if args.json:
        print(json.dumps(figures, separators=(",", ":")))
    else:
        print(f"\nfuzz campaign, profile {figures['profile']}, {figures['seconds']} s")
        for name, entry in figures["targets"].items():
            print(
                f"  {name:<11} {entry['cases']:>7} cases  {entry['tests']:>3} tests  "
                f"{entry['failures']} failed"
            )
        if "checkpoint" in targets:
            print(
                f"  checkpoint corruptions: {ck['tried']} tried, {ck['detected']} detected, "
                f"{ck['restored']} restored from the previous good checkpoint"
            )
    bad = (
        figures["failures"] or figures["pytest_exit"] not in (0, 5) or ck["detected"] != ck["tried"]
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
