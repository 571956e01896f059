"""A verdict a person reads at a glance, and loses nothing by it.

Real runs (an accepted one that survives a kill, with checkpoints, and a rejected one):
every line of the verdict that ``run`` and ``show`` print fits in 100 columns and the
accepted verdict fits one screen, while each check's whole evidence is still in
``show --explain`` and in the HTML report.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from acceptrun.record.workspace import RunRecord
from acceptrun.verdict.core import WIDTH
from conftest import Project

SCREEN = 40  # lines of a terminal screen

WORK = """
import os, sys, time
import torch
from torch import nn
import acceptrun

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run = acceptrun.init()
start = run.restore(model=model, optimizer=opt)
for step in run.steps(start, 24):
    x = torch.randn(8, 4)
    loss = (model(x) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.02)
    run.log(step, loss=loss.item(), samples=8)
    if os.environ.get("CRASH") and step == 3:
        raise ValueError("bad batch at step 3 " + "and a long explanation " * 8)
    run.maybe_checkpoint(step)
run.metric("final/loss", loss.item())
"""

SPEC = """
[checkpoint]
every_steps = 5
keep_last = 2
[limits]
max_restarts = {restarts}
restart_backoff = "0s"
[cost]
price_per_hour = 0.5
"""


def _verdict_lines(text: str) -> list[str]:
    """The lines of the verdict in a command's output: from its label to the end."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if re.match(r"(ACCEPTED|REJECTED)  ", ln))
    # `run` prints the record's path after the verdict: a path, not a finding.
    return [ln for ln in lines[start:] if not ln.startswith("record: ")]


def _words(text: str) -> str:
    return "".join(text.split())  # wrapped lines, a long path broken: the same characters


def _run(project: Project, *, crash: bool) -> tuple[RunRecord, str]:
    extra = SPEC.format(restarts=0 if crash else 2)
    if crash:
        extra = 'env = { CRASH = "1" }\n' + extra
    spec = project.spec(WORK, extra=extra)
    args = ["run", str(spec)] if crash else ["run", "--inject", "kill@step=12", str(spec)]
    proc = project.cli(*args, timeout=300)
    assert proc.returncode == (1 if crash else 0), proc.stdout + proc.stderr
    return project.only_record(), proc.stdout


@pytest.mark.parametrize("crash", [False, True], ids=["accepted", "rejected"])
def test_every_verdict_line_fits_and_every_finding_is_one_command_away(
    project: Project, crash: bool
) -> None:
    record, out = _run(project, crash=crash)
    printed = _verdict_lines(out)
    assert printed[0].startswith("REJECTED" if crash else "ACCEPTED"), printed
    show = project.cli("show", record.run_id, check_rc=0).stdout
    for lines in (printed, _verdict_lines(show)):
        wide = [ln for ln in lines if len(ln) > WIDTH]
        assert not wide, wide
    if not crash:
        assert len(printed) <= SCREEN, "\n".join(printed)
    explain = project.cli("show", "--explain", record.run_id, check_rc=0).stdout
    assert not [ln for ln in _verdict_lines(explain) if len(ln) > WIDTH]
    report = html.unescape(Path(project.cli("report", record.run_id, check_rc=0)
                                .stdout.strip().splitlines()[-1]).read_text())  # fmt: skip
    checks = json.loads((record.path / "verdict.json").read_text())["checks"]
    for c in checks:  # nothing was lost: each finding whole in --explain and the report
        assert _words(c["evidence"]) in _words(explain), c
        assert _words(c["evidence"]) in _words(report), c["name"]
    if crash:  # the long failure is cut on the screen, whole one command away
        assert any(ln.endswith(" …") or " … " in ln for ln in printed), printed
        assert f"acceptrun show --explain {record.run_id}" in printed[-1], printed
