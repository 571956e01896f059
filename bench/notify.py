"""Time to detect per notification kind: real runs, a real webhook receiver on loopback.

    python bench/notify.py                 # 3 runs of each kind
    python bench/notify.py --reps 1 --json

For each kind a small run is made to produce the condition (a NaN loss, a user error, a
hang past a 3 s hang window, an idle loop past a 3 s idle window, a budget share crossed,
an accepted run, a rejected one, a checkpoint damaged before a restart, a mirror whose
folder is taken away before a save, a supervisor killed with SIGKILL while `acceptrun watch --every 0.5s`
follows the workspace), with ``[notify] webhook`` pointing at an HTTP server on
127.0.0.1. Time to detect is read from the record's ``notify`` events: the delivery's
time minus the condition's own recorded time. Prints the median and the largest per
kind, and the tries; exit status 1 when a message was not delivered.

What the figure holds: the follower's poll of events.jsonl (0.25 s), the queue, one
HTTP round trip on loopback; for a gone supervisor, the lease's renewal interval (2 s:
the condition's time is its last renewal) and the watcher's period.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from notify_receivers import (  # lives with the tests that use it
    CORRUPTS,
    MIRROR_LAGS,
    WebhookReceiver,
    release,
    watchdog_of,
)

from conftest import wait_for  # the suite's one wait

PY = sys.executable

LOOP = """
import time, acceptrun
run = acceptrun.init()
for step in run.steps(0, {steps}):
    run.log(step, loss={loss})
    {extra}
"""

# kind -> (script, spec sections before [notify])
KINDS: dict[str, tuple[str, str]] = {
    "divergence": (LOOP.format(steps=50, loss='float("nan") if step == 5 else 1.0', extra=""),
                   "[limits]\nmax_restarts = 0\n"),
    "attempt_failed": ("import no_such_module_xyz\n", "[limits]\nmax_restarts = 0\n"),
    "hang": ("import signal\nprint('started', flush=True)\nsignal.pause()\n",
             '[limits]\nhang_window = "3s"\nmax_restarts = 0\n'),
    "idle_stop": (LOOP.format(steps=100, loss="1.0", extra=(
        "if step >= 3:\n        while not run.stop_requested:\n            time.sleep(0.05)")),
        '[limits]\nidle_window = "3s"\n[telemetry]\ninterval = "0.5s"\n'),
    "accepted": (LOOP.format(steps=5, loss="1.0 / (1 + step)", extra=""), ""),
    "supervisor_gone": ("import signal\nprint('started', flush=True)\nsignal.pause()\n",
                        '[limits]\ngrace_period = "1s"\n'),
}  # fmt: skip

PRICES = """
[[price]]
provider = "benchcloud"
instance = "fast"
gpus = 0
price_per_hour = 3600.0
billing = "per_second"
minimum_s = 1
start_rule = "launch"
storage_per_gib_month = 0.0
source = "a bench price list"
date = "2026-12-01"
"""
KINDS["rejected"] = KINDS["divergence"]
KINDS["checkpoint_quarantined"] = (CORRUPTS, "[limits]\nrestart_backoff = 0\n")
KINDS["mirror_behind"] = (
    MIRROR_LAGS,
    'env = {{ MIRROR = "{root}/mirror", MIRROR_GO = "{root}/go" }}\n[limits]\nmax_restarts = 0\n'
    '[checkpoint]\nmirror = "{root}/mirror"\n',
)

KINDS["budget"] = (
    LOOP.format(steps=100000, loss="1.0", extra="time.sleep(0.02)"),
    '[cost]\nprovider = "benchcloud"\ninstance = "fast"\n'
    '[limits]\nbudget_usd = 8.0\ngrace_period = "2s"\nmax_restarts = 0\n',
)


def _acceptrun(*args: str, **kw: Any) -> Any:
    return subprocess.run([PY, "-m", "acceptrun", *args], capture_output=True, text=True,
                          check=False, **kw)  # fmt: skip


def _events(ws: Path, kind: str) -> list[dict[str, Any]]:
    out = []
    for path in (ws / "runs").glob("*/events.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip() and (ev := json.loads(line)).get("kind") == kind:
                out.append(ev)
    return out


def one_run(root: Path, kind: str) -> list[dict[str, Any]]:
    """Run one job that makes ``kind``; its notify events of that kind."""
    script, sections = KINDS[kind]
    root.mkdir(parents=True)
    ws = root / "ws" / ".acceptrun"
    ws.mkdir(parents=True)
    (ws / "prices.toml").write_text(PRICES)
    (root / "train.py").write_text(textwrap.dedent(script))
    lags = kind == "mirror_behind"
    if lags:  # the script waits on this FIFO until the message came
        os.mkfifo(root / "go")
    with WebhookReceiver(on_post=(lambda _body: release(root / "go")) if lags else None) as hook:
        spec = root / "spec.toml"
        spec.write_text(
            f'name = "notify-bench"\ncommand = ["{PY}", "train.py"]\n'
            f"{sections.format(root=root)}"
            f'[notify]\nwebhook = "{hook.url}"\nevents = ["{kind}"]\n'
            + ("budget_fractions = [0.5]\n" if kind == "budget" else "")
        )
        if kind != "supervisor_gone":
            _acceptrun("--workspace", str(ws), "run", str(spec), cwd=root, timeout=600)
        else:
            watch = subprocess.Popen([PY, "-m", "acceptrun", "--workspace", str(ws), "watch",
                                      "--every", "0.5s"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)  # fmt: skip
            sup = subprocess.Popen([PY, "-m", "acceptrun", "--workspace", str(ws), "run",
                                    str(spec)], cwd=root, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)  # fmt: skip
            try:
                wait_for(lambda: _events(ws, "attempt_start"), 300, what="attempt 1")
                wait_for(lambda: watchdog_of(sup.pid), 300, what="the watchdog")  # no orphan after
                sup.send_signal(signal.SIGKILL)
                sup.wait(60)
                wait_for(lambda: _events(ws, "notify"), 300, what="the delivery")
            finally:
                for proc in (sup, watch):
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGINT if proc is watch else signal.SIGKILL)
                    proc.wait(120)
    return [e for e in _events(ws, "notify") if e.get("event") == kind]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="runs per kind (default 3)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds")
    parser.add_argument("--root", type=Path, default=None, help="scratch directory")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    root = args.root or Path(tempfile.mkdtemp(prefix="notify-bench-"))
    results: dict[str, dict[str, Any]] = {}
    bad = 0
    for kind in args.kinds.split(","):
        ttds, tries, outcomes = [], [], []
        for rep in range(args.reps):
            for ev in one_run(root / f"{kind}-{rep}", kind):
                outcomes.append(ev["outcome"])
                tries.append(ev["attempts"])
                if ev["outcome"] == "delivered":
                    ttds.append(float(ev["time_to_detect_s"]))
        bad += len(ttds) < args.reps or any(o != "delivered" for o in outcomes)
        results[kind] = {
            "runs": args.reps, "messages": len(ttds),
            "median_s": round(statistics.median(ttds), 3) if ttds else None,
            "max_s": round(max(ttds), 3) if ttds else None,
            "max_tries": max(tries) if tries else None, "outcomes": outcomes,
        }  # fmt: skip
        print(f"{kind}: {results[kind]}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"bench": "notify", "kinds": results}, sort_keys=True))
    else:
        print(f"{'kind':<22} {'runs':>4} {'messages':>9} {'median s':>9} {'max s':>8} {'tries':>5}")
        for kind, r in results.items():
            med = "-" if r["median_s"] is None else f"{r['median_s']:.3f}"
            top = "-" if r["max_s"] is None else f"{r['max_s']:.3f}"
            print(f"{kind:<22} {r['runs']:>4} {r['messages']:>9} {med:>9} {top:>8} "
                  f"{r['max_tries'] or '-':>5}")  # fmt: skip
        print("time to detect: the delivery's time minus the condition's own recorded time "
              "(measured, per message)")  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
