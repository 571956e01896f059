"""SIGKILL a process that saves checkpoints, many times, and count broken promises.

    python bench/kill_campaign.py --kills 500 --root /tmp/kc

prints one JSON line, for example
``{"kills": 500, "corrupt_latest": 0, "lost_committed": 0, "seconds": 171.3, ...}``.
The extra fields say where kills landed (mid-save, mid-retention-delete, between the
rename and LATEST) and how many commits were reported in all. Exit status 1 when any
promise broke; the details go to stderr. Reusing a root continues its history.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

from ckpt_kill_worker import run_campaign  # lives with the tests that use it


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=100, help="how many SIGKILLs (100)")
    parser.add_argument("--root", type=Path, help="checkpoint root (default: a new temp dir)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill delays (0)")
    parser.add_argument(
        "--max-delay", type=float, default=0.3, help="seconds of saving before a kill, at most"
    )
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="kill-campaign-"))
    figures = run_campaign(root, args.kills, seed=args.seed, max_delay=args.max_delay)
    details = figures.pop("details")
    print(json.dumps(figures), flush=True)
    for line in details:
        print(line, file=sys.stderr)
    broken = ("corrupt_latest", "lost_committed", "bad_listed", "stale_left")
    return 1 if any(figures[k] for k in broken) or not figures["continued"] else 0


if __name__ == "__main__":
    sys.exit(main())
