"""SIGKILL the supervisor (`acceptrun run`) N times at random moments; count broken promises.

    python bench/supervisor_kills.py --kills 100
    python bench/supervisor_kills.py --kills 10 --json     # one JSON object (bench/chaos.py)

Each kill: a fresh run of a small deterministic training script (torch, the client API,
a checkpoint every 5 steps, a save that takes 0.3 s) is started with `acceptrun run`; at a
random moment (preflight, a random step, mid-checkpoint, the close; found by waiting for
the event or file, see tests/supervisor_kill_harness.py) the supervisor gets SIGKILL.
Then: no process of the run may survive its grace period (orphans), `acceptrun ls` must
show it `interrupted`, `acceptrun resume` must end ACCEPTED, the final weights must be
bitwise equal to an uninterrupted run's, and no committed checkpoint step may be lost.

Prints a table (kills, orphans, interrupted, resumes accepted, bitwise equal, lost, time);
exit status 1 when any promise broke. Figures of one kill at a time go to stderr.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

from supervisor_kill_harness import (  # lives with the tests that use it
    MOMENTS,
    kill_and_resume,
    make_job,
    reference_digest,
)

TOTAL_STEPS = 30


def campaign(kills: int, root: Path, seed: int, max_minutes: float | None = None) -> dict[str, Any]:
    rng = random.Random(seed)
    t0 = time.monotonic()
    reference = reference_digest(root, root / "ws-reference", total=TOTAL_STEPS)
    counts = dict.fromkeys(
        ("kills", "orphans", "interrupted", "resumes_accepted", "bitwise_equal", "lost"), 0
    )
    moments = dict.fromkeys(MOMENTS, 0)
    failures: list[str] = []
    for n in range(kills):
        if max_minutes is not None and time.monotonic() - t0 > 60 * max_minutes:
            break  # out of time: the figures count the kills done
        moment = rng.choice(MOMENTS)
        step = rng.randrange(1, TOTAL_STEPS - 1)
        name = f"kill-{n:04d}"
        counts["kills"] += 1
        try:
            res = kill_and_resume(
                make_job(root, name, total=TOTAL_STEPS), root / f"ws-{name}", moment,
                reference=reference, step=step,
            )  # fmt: skip
        except Exception as exc:  # a kill that could not be checked is a failure, not a skip
            failures.append(f"{name} {moment}: {type(exc).__name__}: {exc}")
            print(f"{name} {moment:<10} FAILED: {failures[-1]}", file=sys.stderr, flush=True)
            continue
        moments[moment] += 1
        counts["orphans"] += len(res.orphans)
        counts["interrupted"] += res.shown == "interrupted"
        counts["resumes_accepted"] += res.accepted
        counts["bitwise_equal"] += res.bitwise
        counts["lost"] += res.lost_steps
        ok = not res.orphans and res.shown == "interrupted" and res.accepted and res.bitwise
        if not ok or res.lost_steps:
            failures.append(f"{name} {moment} step {step}: {res}")
        print(
            f"{name} {moment:<10} step {step:>2}: orphans {len(res.orphans)}, shown {res.shown}, "
            f"accepted {res.accepted}, bitwise {res.bitwise}, lost {res.lost_steps}, "
            f"{res.seconds:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    return {
        **counts, "asked": kills, "moments": moments, "failures": failures,
        "seconds": round(time.monotonic() - t0, 1), "root": str(root),
    }  # fmt: skip


def table(f: dict[str, Any]) -> str:
    rows = [
        ("kills", f"{f['kills']} (of {f['asked']} asked)"),
        ("orphans", f["orphans"]),
        ("shown interrupted", f["interrupted"]),
        ("resumes accepted", f["resumes_accepted"]),
        ("bitwise equal", f["bitwise_equal"]),
        ("lost (checkpointed steps)", f["lost"]),
        ("failures", len(f["failures"])),
        ("time", f"{f['seconds']} s"),
        ("moments", ", ".join(f"{k} {v}" for k, v in f["moments"].items())),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=100, help="how many SIGKILLs (100)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the moments (0)")
    parser.add_argument("--root", type=Path, help="work directory (default: a new temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--max-minutes", type=float, help="start no kill after this many minutes (no limit)"
    )
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="supervisor-kills-"))
    root.mkdir(parents=True, exist_ok=True)
    figures = campaign(args.kills, root, args.seed, args.max_minutes)
    print(json.dumps(figures) if args.json else table(figures), flush=True)
    for line in figures["failures"]:
        print(f"FAILED {line}", file=sys.stderr)
    broken = figures["failures"] or figures["orphans"] or figures["lost"]
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
