"""No script of bench/ may be named like a standard-library module.

Python puts a script's directory first on sys.path, so bench/queue.py once shadowed the
standard ``queue`` for every script in bench/ (torch imports it) and broke them all.
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_no_bench_script_shadows_a_standard_library_module() -> None:
    names = {p.stem for p in BENCH.glob("*.py")}
    assert names, f"no scripts found in {BENCH}"
    shadowing = sorted(names & set(sys.stdlib_module_names))
    assert not shadowing, f"rename bench/{shadowing[0]}.py: it shadows the standard library"
