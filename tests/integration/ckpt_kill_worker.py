"""Kill campaign for the checkpoint store: a worker that saves forever, and the driver.

Worker (a real process the campaign SIGKILLs)::

    python tests/ckpt_kill_worker.py ROOT SEED [COUNT]

resumes from the newest verified checkpoint in ROOT, then saves step after step (three
files of 0-2 MB whose content is a function of the step, plus a small JSON file) with
``keep_last=2``, printing ``committed N`` after each commit returns. COUNT stops it after
that many saves; without it, it saves until killed.

:func:`run_campaign` starts the worker, kills it after a random delay, and checks the
store's promises after every kill. ``tests/integration/test_checkpoint_store_crashes.py``
runs it with 50 kills; ``bench/kill_campaign.py`` with any number.
"""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from acceptrun.checkpoint.store import LATEST, CheckpointStore

MAX_FILE = 2 * 1024 * 1024  # bytes


def expected_files(step: int) -> dict[str, bytes]:
    """What checkpoint ``step`` contains: the checker recomputes it to compare bytes."""
    rng = random.Random(step)
    files = {f"shard-{i}.bin": rng.randbytes(rng.randint(0, MAX_FILE)) for i in range(3)}
    files["trainer/state.json"] = json.dumps({"step": step}).encode()
    return files


def worker(root: Path, seed: int, count: int | None) -> None:
    store = CheckpointStore(root, keep_last=2)
    store.remove_stale_staging()  # what a new attempt does before it saves
    latest = store.latest_verified()
    step = latest.step + 1 if latest else 1
    rng = random.Random(seed)
    print("ready", flush=True)
    saved = 0
    while count is None or saved < count:
        writer = store.begin(step)
        for name, data in expected_files(step).items():
            chunk = rng.choice((4096, 65536, 1 << 20))  # vary where writes split
            view = memoryview(data)
            with writer.open(name) as f:
                for offset in range(0, len(data), chunk):
                    f.write(view[offset : offset + chunk])
        store.commit(writer, metrics={"loss": 1.0 / step})
        print(f"committed {step}", flush=True)
        step += 1
        saved += 1


def check_root(root: Path, highest: int | None) -> dict[str, Any]:
    """The store's promises after a kill, and where the kill landed.

    ``highest`` is the newest step any worker reported committed before its kill.
    """
    found: dict[str, Any] = {"problems": []}
    names = [p.name for p in root.iterdir()] if root.is_dir() else []
    found["mid_save"] = any(n.startswith(".staging-") for n in names)
    found["mid_delete"] = any(n.startswith(".deleting-") for n in names)
    store = CheckpointStore(root, keep_last=2)
    latest_step = None
    if LATEST in names:
        text = (root / LATEST).read_text()
        latest_step = int(text[5:]) if re.fullmatch(r"step-[0-9]+\n", text) else None
        result = store.verify(latest_step) if latest_step is not None else None
        if result is None or not result.ok:
            found["problems"].append(f"corrupt_latest: {text!r} {result}")
    listed = store.list()
    found["before_latest"] = any(latest_step is not None and i.step > latest_step for i in listed)
    if highest is not None and (latest_step is None or latest_step < highest):
        found["problems"].append(f"lost_committed: LATEST {latest_step}, committed {highest}")
    for info in listed:
        result = store.verify(info.step)
        # Verified bytes must also be the bytes the worker meant to write for that step.
        expected = expected_files(info.step).items()
        same = result.ok and all((info.path / n).read_bytes() == d for n, d in expected)
        if not same:
            found["problems"].append(f"bad_listed: {info.step} {result.problems} same={same}")
    store.remove_stale_staging()
    left = [n for n in (p.name for p in root.iterdir()) if n.startswith(".")] if names else []
    if left:
        found["problems"].append(f"stale_left: {left}")
    return found


def run_campaign(root: Path, kills: int, seed: int = 0, max_delay: float = 0.3) -> dict[str, Any]:
    """SIGKILL ``kills`` workers on one ``root`` after 0..``max_delay`` s of saving each."""
    rng = random.Random(seed)
    counts = dict.fromkeys(["corrupt_latest", "lost_committed", "bad_listed", "stale_left"], 0)
    figures: dict[str, Any] = {"kills": 0, **counts, "commits": 0, "killed_mid_save": 0}
    figures.update(killed_mid_delete=0, killed_before_latest=0, details=[])
    highest: int | None = None
    started = time.monotonic()
    for kill in range(kills):
        command = [sys.executable, __file__, str(root), str(rng.randrange(1 << 32))]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            proc.kill()
            raise RuntimeError(f"worker did not start: {proc.communicate()[1]}")
        # Every other kill waits for the worker's first commit (an event, not a guess about
        # the machine's speed), so kills land among saves on a slow machine too.
        early: list[str] = []
        while kill % 2 == 1:
            line = proc.stdout.readline()
            if not line:
                break
            early.append(line)
            if line.startswith("committed "):
                break
        time.sleep(rng.uniform(0, max_delay))
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=300)  # also reaps it: a zombie's pid looks alive
        out = "".join(early) + out
        if proc.returncode != -signal.SIGKILL:
            raise RuntimeError(f"worker exited {proc.returncode} before the kill: {err}")
        committed = [
            int(line.split()[1]) for line in out.splitlines() if line.startswith("committed ")
        ]
        figures["commits"] += len(committed)
        if committed:
            highest = max(committed[-1], highest or 0)
        figures["kills"] += 1
        found = check_root(root, highest)
        figures["killed_mid_save"] += found["mid_save"]
        figures["killed_mid_delete"] += found["mid_delete"]
        figures["killed_before_latest"] += found["before_latest"]
        for problem in found["problems"]:
            figures[problem.split(":")[0]] += 1
            figures["details"].append(f"kill {kill}: {problem}")
    # A new attempt on the same root continues saving, past everything committed.
    done = subprocess.run(
        [sys.executable, __file__, str(root), str(seed), "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    steps = [
        int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("committed")
    ]
    figures["continued"] = done.returncode == 0 and len(steps) == 2 and steps[0] > (highest or 0)
    if not figures["continued"]:
        figures["details"].append(f"continue: rc {done.returncode} {steps} {done.stderr[-2000:]}")
    figures["seconds"] = round(time.monotonic() - started, 2)
    return figures


if __name__ == "__main__":
    worker(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
