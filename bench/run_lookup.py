"""What finding a run across the user's workspaces costs: the lookup every command takes.

    python bench/run_lookup.py [--workspaces 20] [--runs 50] [--repeats 20]

Makes ``--workspaces`` workspaces of ``--runs`` real run records each (run directories with
their run.json, through ``Workspace.create_run``), lists them all in a fresh list of
workspaces, then times :func:`acceptrun.record.lookup.find_run` from the first one:

- an id of the current workspace (the common case: one directory listing);
- an id of the last listed workspace (every workspace's runs listed once);
- a unique prefix of it;
- an id that is nowhere (the miss, which lists every workspace and builds its message).

Then ``acceptrun show ID`` as a real process, for an id here and one in the last
workspace: what the user waits for, start-up included. Figures are medians of
``--repeats`` (in-process) and of 5 runs (processes), in milliseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from acceptrun.record import registry
from acceptrun.record.lookup import find_run
from acceptrun.record.workspace import Workspace

SPEC = 'name = "bench"\ncommand = ["true"]\n'


def _make(root: Path, workspaces: int, runs: int) -> list[tuple[Workspace, list[str]]]:
    made = []
    for w in range(workspaces):
        ws = Workspace.create(root / f"proj{w:03d}" / ".acceptrun")
        ids = []
        for r in range(runs):
            run_id = f"20261204-{w:03d}{r:03d}-bench-{w:02x}{r:02x}"[:40]
            state = {"mode": "supervised", "status": "finished", "verdict": "accepted"}
            ws.create_run("bench", spec_text=SPEC, state=state, run_id=run_id)
            ids.append(run_id)
        registry.remember(ws.root)
        made.append((ws, ids))
    return made


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _miss() -> None:
    try:
        find_run("nosuch-run-zz")
    except Exception as exc:  # the miss is the figure; its message is checked below
        assert "no run 'nosuch-run-zz'" in str(exc), exc
    else:
        raise AssertionError("a missing run was found")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workspaces", type=int, default=20)
    p.add_argument("--runs", type=int, default=50, help="runs in each workspace")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="acceptrun-lookup-") as tmp:
        root = Path(tmp)
        os.environ[registry.ENV_CONFIG_DIR] = str(root / "config")
        os.environ.pop("ACCEPTRUN_WORKSPACE", None)
        t0 = time.perf_counter()
        made = _make(root, args.workspaces, args.runs)
        setup = time.perf_counter() - t0
        first, last = made[0], made[-1]
        os.chdir(first[0].root.parent)
        here_id, far_id = first[1][-1], last[1][-1]
        assert find_run(here_id).where == "here" and find_run(far_id).where == "listed"
        total = args.workspaces * args.runs
        print(f"{args.workspaces} workspaces x {args.runs} runs ({total} records, made in "
              f"{setup:.1f} s); medians of {args.repeats}")  # fmt: skip
        rows = [
            ("id in the current workspace", lambda: find_run(here_id)),
            ("id in the last listed workspace", lambda: find_run(far_id)),
            ("unique prefix, last workspace", lambda: find_run(far_id[:-1])),
            ("miss (every workspace listed)", _miss),
        ]
        for label, fn in rows:
            print(f"  find_run: {label:<34} {_median_ms(fn, args.repeats):8.2f} ms")
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
        for label, run_id in (("here", here_id), ("in the last workspace", far_id)):

            def show(run_id: str = run_id) -> None:
                subprocess.run(
                    [sys.executable, "-m", "acceptrun", "show", run_id], env=env, check=True,
                    capture_output=True, timeout=120,
                )  # fmt: skip

            print(f"  acceptrun show, a run {label:<22} {_median_ms(show, 5):8.1f} ms (process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
