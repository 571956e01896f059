"""What redaction costs on the hot path: a step event at every write, a line of stderr.

    python bench/redact.py [--repeats 200000] [--baseline REF]

Every record write redacts its object (:func:`acceptrun._util.redact.redact_record`, an
event per training step) and every line acceptrun quotes or prints goes through
:func:`acceptrun._util.redact.redact_text`. Times, in microseconds per call (the median
of 7 rounds of ``--repeats`` calls, ``--repeats // 100`` for the 1 kB lines):

- a step event (numbers and the short word "step": the common case);
- an event with strings (a checkpoint event: a path, a hash, a reason);
- a 1 kB line of stderr without a secret (a traceback's frames, a tqdm bar);
- a 1 kB line of stderr holding a GitHub token in the middle.

``--baseline REF`` (a git revision, e.g. ``HEAD~3``) loads that revision's redact.py beside
this one and times both in turns, round by round, so a loaded machine slows both alike.

Also the import of the redactor alone (``python -X importtime``, milliseconds): the shape
rules are compiled on first use, so ``acceptrun --help`` does not pay for them.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from acceptrun._util import redact

STEP = {"t": 1765100000.123456, "kind": "step", "attempt": 1, "step": 1234, "loss": 2.3456,
        "lr": 3e-4, "step_time": 0.1234, "samples": 256, "grad_norm": 1.01}  # fmt: skip
CHECKPOINT = {
    "t": 1765100000.5, "kind": "checkpoint", "attempt": 1, "step": 1000,
    "path": "/data/runs/20261207-105500-charlm-3f2a/checkpoints/step-00001000",
    "hash": "xxh3_128:0123456789abcdef0123456789abcdef", "reason": "interval",
    "bytes": 123456789, "seconds": 1.25,
}  # fmt: skip
FRAME = '  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1518, in _wrapped_call_impl\n'  # fmt: skip
LINE = (FRAME * (1024 // len(FRAME) + 1))[:1024]
SECRET_LINE = LINE[:500] + " token ghp_R8kqZ2vT5mXw1yB7nC3dF6gH9jK0lP4sQ2aE " + LINE[:478]


def _median_us(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median microseconds per call of each of ``fns``, timed in turns over 7 rounds."""
    rounds: list[list[float]] = [[] for _ in fns]
    for _ in range(7):
        for fn, times in zip(fns, rounds, strict=True):
            t0 = time.perf_counter()
            for _ in range(repeats):
                fn()
            times.append((time.perf_counter() - t0) / repeats)
    return [statistics.median(times) * 1e6 for times in rounds]


def _revision(ref: str) -> ModuleType:
    """redact.py as it was at git revision ``ref``, loaded as a module of its own."""
    root = Path(__file__).resolve().parent.parent
    text = subprocess.run(
        ["git", "show", f"{ref}:src/acceptrun/_util/redact.py"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "redact_baseline.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("redact_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _import_ms() -> float:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import acceptrun._util.redact"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    last = [ln for ln in out.stderr.splitlines() if ln.endswith("acceptrun._util.redact")]
    return int(re.split(r"\s*\|\s*", last[-1])[1].strip()) / 1e3  # cumulative, us -> ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200_000, help="calls a round (>= 1)")
    parser.add_argument("--baseline", metavar="REF", help="also time redact.py of this revision")
    args = parser.parse_args()
    n = args.repeats
    if n < 1:
        parser.error(f"--repeats {n}: give 1 or more")
    mods: list[Any] = [redact] + ([_revision(args.baseline)] if args.baseline else [])
    for mod in mods:
        mod.redact_text(SECRET_LINE)  # the first call compiles what is compiled lazily
    cases = [
        ("step event (redact_record)", lambda m: m.redact_record(STEP), n),
        ("checkpoint event (redact_record)", lambda m: m.redact_record(CHECKPOINT), n),
        ("1 kB stderr line (redact_text)", lambda m: m.redact_text(LINE), max(1, n // 100)),
        ("1 kB line with a token", lambda m: m.redact_text(SECRET_LINE), max(1, n // 100)),
    ]
    head = f"{'':36s} {'this tree':>12s}" + (f" {args.baseline:>12s}" if args.baseline else "")
    print(head)
    for name, call, repeats in cases:
        times = _median_us([functools.partial(call, m) for m in mods], repeats)
        print(f"{name:36s}" + "".join(f" {us:9.2f} us" for us in times))
    print(f"{'import acceptrun._util.redact':36s} {_import_ms():9.1f} ms")


if __name__ == "__main__":
    main()
