"""Where the test suite's CPU goes: per file and per test, from ACCEPTRUN_TEST_CPU_LOG.

::

    make suite-cpu                                   # runs the integration tier, then this
    ACCEPTRUN_TEST_CPU_LOG=/tmp/cpu.jsonl pytest -n 4 --dist loadfile tests/integration
    python tools/suite_cpu.py /tmp/cpu.jsonl --top 25

Each line of the log is one test: CPU seconds in its pytest process ("own": the test's
code and what it runs in-process, such as a supervisor started with ``launch()``) and in
the children that process reaped during the test ("children": workloads, ``acceptrun``
commands, torchrun and its ranks). On two cores, the tier's wall time cannot be below
the total CPU divided by two: this is the figure to bring down.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("log", type=Path, help="the ACCEPTRUN_TEST_CPU_LOG file")
    parser.add_argument("--top", type=int, default=20, help="rows of each table (20)")
    parser.add_argument("--cores", type=int, default=2, help="cores for the wall floor (2)")
    args = parser.parse_args()
    try:
        lines = args.log.read_text().splitlines()
    except OSError as exc:
        sys.exit(
            f"{args.log}: {exc.strerror}; run the suite with ACCEPTRUN_TEST_CPU_LOG={args.log}"
        )
    rows = [json.loads(line) for line in lines if line.strip()]
    if not rows:
        sys.exit(f"{args.log} holds no test; run the suite with ACCEPTRUN_TEST_CPU_LOG set")
    total = sum(r["own"] + r["children"] for r in rows)
    own = sum(r["own"] for r in rows)
    print(f"tests {len(rows)}   CPU {total:.0f} s (in pytest {own:.0f} s, in children "
          f"{total - own:.0f} s)   floor on {args.cores} cores {total / args.cores / 60:.1f} min")  # fmt: skip

    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        f = files[r["test"].split("::")[0]]
        f[0] += r["own"] + r["children"]
        f[1] += r["wall"]
        f[2] += 1
    print(f"\n{'CPU s':>7} {'share':>6} {'wall s':>7} {'tests':>5}  file")
    for name, (cpu, wall, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{cpu:7.0f} {cpu / total:6.1%} {wall:7.0f} {n:5d}  {name}")

    print(f"\n{'CPU s':>7} {'own':>6} {'wall s':>7}  test")
    ranked = sorted(rows, key=lambda r: -(r["own"] + r["children"]))[: args.top]
    for r in ranked:
        cpu = r["own"] + r["children"]
        print(f"{cpu:7.1f} {r['own']:6.1f} {r['wall']:7.1f}  {r['test']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
