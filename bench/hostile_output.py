"""How late ``limits.wall_time`` fires while a workload prints hostile lines as fast as it can.

    python bench/hostile_output.py [--repeats 3] [--wall 4]

Real ``acceptrun run --quiet`` runs of a script that writes 64 KiB lines of x's in a loop
(hundreds of MB a second to its log), with a ``progress.pattern`` each:

- ``quiet``: the baseline, a script that sleeps (no output at all);
- ``(x+x+)+y``: exponential on Python's ``re`` (the supervisor never came back), linear
  on RE2;
- ``(.*x){181}``: linear on RE2 too, near the largest program allowed
  (_util/userregex.MAX_PROGRAM), about a second for one 64 KiB line.

For each, over ``--repeats`` runs (the median, and the worst):

- ``late_max``: ``stop_sent`` minus ``run_start`` minus the wall time: an upper bound of
  how late the stop came (``run_start`` is written before the supervisor starts its clock,
  so it holds the launch's own set-up too: compare it with the quiet baseline);
- ``late_min``: ``stop_sent`` minus ``attempt_start`` minus the wall time: a lower bound
  (the attempt starts after the clock);
- ``exit_s``: from ``stop_sent`` to the attempt's recorded end (the reader thread's last
  poll is in it: budget + one line);
- ``cli_s``: the whole command, launch to exit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOSTILE = """\
import sys
line = "x" * 65535 + "\\n"
write = sys.stdout.write
while True:
    write(line)
"""
QUIET = "import time\ntime.sleep(3600)\n"
CASES = {
    "quiet": (QUIET, r"(?P<step>\d+)"),
    "(x+x+)+y": (HOSTILE, r"(?P<step>\d*)(x+x+)+y"),
    "(.*x){181}": (HOSTILE, r"(?P<step>\d*)(.*x){181}"),
}


def one_run(script: str, pattern: str, wall: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "work.py").write_text(script)
        (root / "spec.toml").write_text(
            f'name = "b"\ncommand = [{json.dumps(sys.executable)}, "work.py"]\n'
            f"[progress]\npattern = {json.dumps(pattern)}\n"
            f'[limits]\nwall_time = "{wall:g}s"\n'
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
        t0 = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "acceptrun", "--workspace", str(root / "ws"), "run",
             "--quiet", "spec.toml"],
            cwd=root, env=env, capture_output=True, timeout=600, check=False,
        )  # fmt: skip
        cli_s = time.monotonic() - t0
        (run_dir,) = (root / "ws" / "runs").iterdir()
        events = {}
        with open(run_dir / "events.jsonl") as f:
            for line in f:
                ev = json.loads(line)
                events.setdefault(ev["kind"], ev)
        stop = events["stop_sent"]["t"]
        return {
            "late_max": stop - events["run_start"]["t"] - wall,
            "late_min": stop - events["attempt_start"]["t"] - wall,
            "exit_s": events["attempt_exit"]["t"] - stop,
            "cli_s": cli_s,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--wall", type=float, default=4.0, help="limits.wall_time, seconds")
    args = parser.parse_args()
    print(f"wall_time = {args.wall:g}s, {args.repeats} runs each: median (worst), seconds")
    print(f"{'pattern':<22}{'late_max':>16}{'late_min':>16}{'exit_s':>16}{'cli_s':>16}")
    for name, (script, pattern) in CASES.items():
        runs = [one_run(script, pattern, args.wall) for _ in range(args.repeats)]
        cells = []
        for key in ("late_max", "late_min", "exit_s", "cli_s"):
            values = [r[key] for r in runs]
            cells.append(f"{statistics.median(values):.2f} ({max(values):.2f})")
        print(f"{name:<22}" + "".join(f"{c:>16}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
