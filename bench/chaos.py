"""Every reliability campaign, one table: what was tried, what was lost.

    python bench/chaos.py --workload-kills 500 --supervisor-kills 100 --concurrent 8
    python bench/chaos.py --smoke            # tiny sizes, the suite's check that it runs
    python bench/chaos.py --json             # one JSON object
    python bench/chaos.py --hostile-only     # the hostile-input campaign alone, by surface

Rows (each campaign's own script or test does the work; this one only sizes and counts):

- workload kills: bench/kill_campaign.py, SIGKILL of a process mid-save; lost = a
  corrupt LATEST, a lost committed step, a bad listing or a stale temporary left;
- supervisor kills: bench/supervisor_kills.py --json, SIGKILL of ``acceptrun run`` at
  random moments, then resume; lost = checkpointed steps lost, orphans, failures;
- fuzz cases: bench/fuzz_campaign.py --json (Hypothesis cases per target); lost = failed
  tests; checkpoint corruptions: tried and detected, lost = undetected ones;
- concurrent runs: tests/integration/test_concurrency.py's scenario, N runs beside gc,
  index rebuild, ls and cost; lost = every broken promise it lists;
- hostile input: every test file that reports a tally (tests/campaign.py), run with the
  tallies logged; one row per input surface (spec path fields, strings that reach a
  shell or an export, record files, checkpoint metadata, board routes, secrets planted,
  ...): cases tried, and lost = tracebacks + hangs + files touched outside the workdir +
  secrets found + the user's files overwritten, plus one row for the files' pytest run (a failed test is a loss). ``--smoke``
  runs the process-free files only.

Exit status 1 when any row lost anything or a campaign failed to run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests"))


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            parsed: dict[str, Any] = json.loads(line)
            return parsed
    raise ValueError(f"no JSON line in the output:\n{text[-2000:]}")


def _script(name: str, *args: str) -> tuple[dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / name), *args],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    try:
        return _last_json(proc.stdout), ""
    except ValueError as exc:
        return {}, f"{name} exited {proc.returncode}: {exc}\n{proc.stderr[-2000:]}"


def workload_kills(n: int, root: Path) -> dict[str, Any]:
    f, error = _script("kill_campaign.py", "--kills", str(n), "--root", str(root / "wk"))
    lost = sum(
        f.get(k, 0) for k in ("corrupt_latest", "lost_committed", "bad_listed", "stale_left")
    )
    return {"campaign": "workload kills (SIGKILL mid-save)", "count": f.get("kills", 0),
            "lost": lost, "error": error, "detail": f}  # fmt: skip


def supervisor_kills(n: int, root: Path) -> dict[str, Any]:
    f, error = _script(
        "supervisor_kills.py", "--kills", str(n), "--json", "--root", str(root / "sk")
    )
    lost = f.get("lost", 0) + f.get("orphans", 0) + len(f.get("failures", []))
    f.pop("failures", None)
    return {"campaign": "supervisor kills (SIGKILL, resume)", "count": f.get("kills", 0),
            "lost": lost, "error": error, "detail": f}  # fmt: skip


def fuzz(profile: str) -> list[dict[str, Any]]:
    targets = ["checkpoint"] if profile == "smoke" else ["spec", "checkpoint", "record", "hostile"]
    f, error = _script("fuzz_campaign.py", "--profile", profile,
                       "--targets", ",".join(targets), "--json")  # fmt: skip
    cases = sum(t["cases"] for t in f.get("targets", {}).values())
    ck = f.get("checkpoint_corruptions", {"tried": 0, "detected": 0})
    return [
        {"campaign": f"fuzz cases ({profile}: {', '.join(targets)})", "count": cases,
         "lost": f.get("failures", 0), "error": error, "detail": f.get("targets", {})},
        {"campaign": "checkpoint corruptions detected", "count": ck["tried"],
         "lost": ck["tried"] - ck["detected"], "error": error,
         "detail": {"detected": ck["detected"], "restored": ck.get("restored", 0)}},
    ]  # fmt: skip


def concurrent(n: int, root: Path) -> dict[str, Any]:
    from test_concurrency import problems, run_concurrently

    work = root / "conc"
    work.mkdir()
    scenario = run_concurrently(work, n_runs=n)
    found = problems(scenario)
    side = {
        " ".join(a): sum(o.args == a for o in scenario.side)
        for a in {o.args for o in scenario.side}
    }
    return {"campaign": "concurrent runs (+ gc, index rebuild, ls, cost)", "count": n,
            "lost": len(found), "error": "\n".join(found), "detail": {"side_commands": side}}  # fmt: skip


def campaign_files(*, unit_only: bool) -> list[Path]:
    """The test files of the hostile-input campaign: every one that reports a tally.

    Found by their use of tests/campaign.py, not listed here, so a new generative test
    joins the campaign the day it is written.
    """
    tiers = ["unit"] if unit_only else ["unit", "integration"]
    return sorted(
        f
        for tier in tiers
        for f in (ROOT / "tests" / tier).glob("test_*.py")
        if "tally(" in f.read_text(encoding="utf-8")
    )


# What a tally counts (tests/campaign.py): every count but "tried" is a loss.
_COUNTS = ("tried", "tracebacks", "hangs", "outside", "secrets", "overwritten")


def hostile_campaign(root: Path, *, unit_only: bool) -> list[dict[str, Any]]:
    """The generative hostile-input tests, run with their tallies logged, one row a surface."""
    files = campaign_files(unit_only=unit_only)
    log = root / "campaign.jsonl"
    log.unlink(missing_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         *map(str, files)],
        capture_output=True, text=True, cwd=ROOT, check=False,
        env={**os.environ, "ACCEPTRUN_CAMPAIGN_LOG": str(log)},
    )  # fmt: skip
    surfaces: dict[str, dict[str, int]] = {}
    if log.exists():
        for line in log.read_text(encoding="utf-8").splitlines():
            t = json.loads(line)
            row = surfaces.setdefault(t["surface"], dict.fromkeys(_COUNTS, 0))
            for k in row:
                row[k] += int(t.get(k, 0))
    error = (
        "" if proc.returncode == 0 else f"pytest exited {proc.returncode}:\n{proc.stdout[-3000:]}"
    )
    if not surfaces and not error:
        error = "no test reported a tally"
    rows = [
        {"campaign": f"hostile input: {name}", "count": r["tried"],
         "lost": sum(r[k] for k in _COUNTS if k != "tried"), "error": "", "detail": r}
        for name, r in sorted(surfaces.items())
    ]  # fmt: skip
    # A failed test is a loss even when its tally was written before it failed.
    rows.append(
        {"campaign": f"hostile input: {len(files)} test files", "count": len(files),
         "lost": int(proc.returncode != 0), "error": error,
         "detail": {"pytest_exit": proc.returncode, "files": [f.name for f in files]}}
    )  # fmt: skip
    return rows


def hostile_table(rows: list[dict[str, Any]]) -> str:
    """Tried, tracebacks, hangs, files touched outside the workdir, secrets found and the
    user's files overwritten, a surface a line."""
    surfaces = [
        r for r in rows if r["campaign"].startswith("hostile input: ") and "tried" in r["detail"]
    ]
    if not surfaces:
        return ""
    width = max(len(r["campaign"]) - len("hostile input: ") for r in surfaces)
    head = f"{'surface':<{width}}  {'tried':>6}  tracebacks  hangs  outside  secrets  overwritten"
    lines = ["", "Hostile input, by surface:", head, "-" * len(head)]
    for r in surfaces:
        d = r["detail"]
        name = r["campaign"][len("hostile input: ") :]
        lines.append(
            f"{name:<{width}}  {d['tried']:>6}  {d['tracebacks']:>10}  {d.get('hangs', 0):>5}"
            f"  {d['outside']:>7}  {d['secrets']:>7}  {d.get('overwritten', 0):>11}"
        )
    return "\n".join(lines)


def table(rows: list[dict[str, Any]], seconds: float) -> str:
    width = max(len(r["campaign"]) for r in rows)
    lines = [f"{'campaign':<{width}}  {'count':>7}  lost", f"{'-' * width}  {'-' * 7}  ----"]
    for r in rows:
        lines.append(f"{r['campaign']:<{width}}  {r['count']:>7}  {r['lost']}")
    lines.append(f"({seconds:.0f} s)")
    for r in rows:
        if r["error"]:
            lines.append(f"\n{r['campaign']}: {r['error']}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workload-kills", type=int, default=500, help="SIGKILLs mid-save (500)")
    parser.add_argument(
        "--supervisor-kills", type=int, default=100, help="supervisor SIGKILLs (100)"
    )
    parser.add_argument(
        "--concurrent", type=int, default=8, help="runs at once in one workspace (8)"
    )
    parser.add_argument(
        "--fuzz-profile", default="deep", help="Hypothesis profile: deep, ci, smoke (deep)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: proves the script runs")
    parser.add_argument("--no-hostile", action="store_true", help="skip the hostile-input rows")
    parser.add_argument(
        "--hostile-only",
        action="store_true",
        help="the hostile-input rows alone (every tallying test file, both tiers)",
    )
    parser.add_argument("--root", type=Path, help="work directory (default: a new temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.smoke:
        args.workload_kills, args.supervisor_kills, args.concurrent = 3, 1, 2
        args.fuzz_profile = "smoke"
    root = args.root or Path(tempfile.mkdtemp(prefix="chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    if not args.hostile_only:
        rows += [
            workload_kills(args.workload_kills, root),
            supervisor_kills(args.supervisor_kills, root),
        ]
        rows += fuzz(args.fuzz_profile)
        rows.append(concurrent(args.concurrent, root))
    if not args.no_hostile:
        # The smoke runs the campaign's process-free files only: the suite runs the rest.
        rows += hostile_campaign(root, unit_only=args.smoke)
    seconds = time.monotonic() - t0
    if args.json:
        print(json.dumps({"rows": rows, "seconds": round(seconds, 1), "root": str(root)}))
    else:
        print(table(rows, seconds) + hostile_table(rows))
    return 1 if any(r["lost"] or r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
