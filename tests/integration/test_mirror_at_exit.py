"""A script that ends right after its last save has that save mirrored, not left pending.

The client's mirror uploads in a thread of the workload's own process. When the script's
last line is its last save, the upload runs while the interpreter exits; s3fs
(aiobotocore) resolves names and reads files in a thread pool, which concurrent.futures
stops among threading's exit hooks, so an upload drained from atexit failed with "cannot
schedule new futures after interpreter shutdown" and the run's newest checkpoint never
left the machine. Against a real S3 server on loopback, under ``acceptrun run``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from acceptrun.checkpoint.mirror_remote import remote_steps

pytest_plugins = ["s3server"]
BUCKET = "acceptrun-test"  # s3server.BUCKET

SCRIPT = """
import torch
import acceptrun

model = torch.nn.Linear(4, 1)
run = acceptrun.init()
start = run.restore(model=model)
for step in run.steps(start, 30):
    run.log(step, loss=1.0 / (step + 1), samples=8)
    if step % 10 == 9:
        run.checkpoint(step, block=True)
# the end of the script: the save of step 29 is still on its way to the mirror
"""


def test_the_last_save_before_the_script_ends_is_mirrored(
    s3: dict[str, Any], tmp_path: Path
) -> None:
    pytest.importorskip("s3fs")
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    mirror = f"s3://{BUCKET}/at-exit-{os.getpid()}"
    (tmp_path / "spec.toml").write_text(
        f'name = "at-exit"\ncommand = [{json.dumps(sys.executable)}, "train.py"]\n'
        f'[checkpoint]\nmirror = "{mirror}"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
    env |= {"AWS_ENDPOINT_URL": s3["endpoint_url"], "AWS_EC2_METADATA_DISABLED": "true"}
    done = subprocess.run(
        [sys.executable, "-m", "acceptrun", "--workspace", "ws", "run", "-q", "spec.toml"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (record,) = [p for p in (tmp_path / "ws" / "runs").iterdir() if not p.name.startswith(".")]
    events = [json.loads(ln) for ln in (record / "events.jsonl").read_text().splitlines()]
    # (a step that retention removed locally before its upload is "skipped": not a failure)
    failed = [
        e for e in events
        if e["kind"] == "mirror_behind" or (e["kind"] == "mirror_failed" and e["state"] != "skipped")
    ]  # fmt: skip
    assert failed == [], failed
    state = json.loads((record / "mirror.json").read_text())["steps"]
    assert state["29"]["state"] == "ok", state
    steps = remote_steps(f"{mirror}/{record.name}", storage_options=s3["storage_options"])
    assert steps[-1] == 29, steps
