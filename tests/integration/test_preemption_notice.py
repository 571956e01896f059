"""A cloud's preemption notice ends a real run with a save inside the notice.

A loopback server speaks AWS's IMDSv2 spot notice (tests/metadata_server.py). The run
(``limits.preemption_notice = "aws"``) trains with the client; once its steps are in the
record, the server gives the notice. The supervisor's next look sees it, SIGTERMs the
workload, which checkpoints the step it is on and exits; the attempt is ``preempted``
(the provider's), not restarted on the machine being taken back, and the verdict's
``preemption notice`` line proves the save: its step, how soon after the notice, and no
step lost.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tests.metadata_server import MetadataServer

from conftest import Project, wait_for

# Steps until step 25, then waits in the step for a signal: the notice's SIGTERM wakes
# it, the client's loop ends the step, checkpoints it and exits (no pace on the clock).
SCRIPT = """
import signal
import torch
import acceptrun

run = acceptrun.init()
model = torch.nn.Linear(4, 4)
run.restore(model=model)
for step in run.steps(0, 100_000):
    run.log(step, loss=1.0 / (1 + step))
    if step >= 25:
        signal.pause()
"""


@pytest.mark.slow
def test_a_notice_saves_the_current_step_and_loses_none(project: Project) -> None:
    with MetadataServer() as md:
        spec = project.spec(
            SCRIPT,
            extra=f"""
[limits]
preemption_notice = "aws"
preemption_notice_url = "{md.url}"
preemption_notice_poll = "0.2s"
grace_period = "60s"
""",
        )
        sup = subprocess.Popen(
            [sys.executable, "-m", "acceptrun", "run", str(spec)], cwd=project.root,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            wait_for(
                lambda: project.run_ids() and len(list(project.only_record().events("step"))) >= 20,
                what="20 steps", alive=sup,
            )  # fmt: skip
            md.give_notice()
            out, _ = sup.communicate(timeout=300)
        finally:
            if sup.poll() is None:
                sup.kill()
                sup.communicate()
    record = project.only_record()
    (notice,) = record.events("preemption_notice")
    assert notice["provider"] == "aws" and notice["action"] == "terminate", notice
    assert md.looks >= 2 and md.refused == 0
    exit1 = json.loads((record.attempt_dir(1) / "exit.json").read_text())
    assert exit1["class"] == "preempted" and exit1["outcome"] == "stopped", exit1
    assert not record.attempt_dir(2).exists()  # not restarted on the machine taken back
    (commit, *_) = [e for e in record.events("checkpoint_commit") if e["t"] >= notice["t"]]
    last = max(e["step"] for e in record.events("step"))
    assert commit["step"] == last  # the step it was on when told: none lost
    verdict = json.loads((record.path / "verdict.json").read_text())
    (check,) = [c for c in verdict["checks"] if c["name"] == "preemption notice"]
    assert check["status"] == "pass", check
    assert f"saved step {last:,} " in check["evidence"] and "; 0 steps lost" in check["evidence"]
    assert "after the notice from aws, inside the 1" in check["evidence"], (check, out[-2000:])
