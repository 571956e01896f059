"""A Python black box's prints reach the supervisor as printed: PYTHONUNBUFFERED and its record.

Through a pipe Python writes stdout in 8 KiB blocks, so a script that never flushes was
read 20 to 60 steps late and its checkpoints dated by those late steps.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from acceptrun.record.workspace import RunRecord
from conftest import PYTHON, Project, wait_for

PATTERN = r"'iter (?P<step>\d+): loss (?P<loss>\S+)'"


def _env() -> dict[str, str]:
    """The test's environment without PYTHONUNBUFFERED, whatever the shell running it set."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def _steps(record: RunRecord) -> list[int]:
    """The steps in the record so far (the step log, record/steplog.py)."""
    return [int(e["step"]) for e in record.events("step")]


@pytest.mark.parametrize("command", ["list", "string"], ids=["python-argv", "sh-c-python"])
def test_a_step_printed_without_flush_is_seen_before_the_script_goes_on(
    project: Project, command: str
) -> None:
    gate = project.root / "gate"
    os.mkfifo(gate)
    # No flush, no -u: the step line sits in Python's buffer unless PYTHONUNBUFFERED is set,
    # and the script then blocks on the FIFO that the test opens only once it saw the step.
    script = f"""
        print("iter 1: loss 0.5")
        with open({str(gate)!r}) as f:
            f.read()
        print("iter 2: loss 0.25")
    """
    spec = project.spec(
        script,
        command=[PYTHON, "work.py"] if command == "list" else f"{PYTHON} work.py",
        extra=f'[progress]\npattern = {PATTERN}\nstream = "stdout"\n',
    )
    proc = subprocess.Popen(
        [PYTHON, "-m", "acceptrun", "--workspace", str(project.workspace), "run", str(spec)],
        cwd=project.root, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        record = wait_for(lambda: project.run_ids() and project.only_record(), alive=proc,
                          timeout=120, what="the run's record")  # fmt: skip
        wait_for(lambda: 1 in _steps(record), alive=proc, timeout=120,
                 what="step 1 in the record while the script waits on its FIFO")  # fmt: skip
        with open(gate, "w") as f:  # the script goes on
            f.write("go\n")
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert _steps(record) == [1, 2]
    state = json.loads((record.path / "run.json").read_text())
    assert state["python_unbuffered"] == {"value": "1", "by": "acceptrun"}
    show = project.cli("show", record.run_id, check_rc=0).stdout
    assert "output   PYTHONUNBUFFERED=1 (set by acceptrun): Python prints are read live" in show


@pytest.mark.parametrize(
    ("extra", "value", "by", "shown"),
    [
        ("python_unbuffered = false\n", None, "off",
         "PYTHONUNBUFFERED unset (python_unbuffered = false)"),
        ('[env]\nPYTHONUNBUFFERED = ""\n', "", "env", "PYTHONUNBUFFERED unset (from the spec's [env])"),
        ('[env]\nPYTHONUNBUFFERED = "x"\n', "x", "env",
         "PYTHONUNBUFFERED=x (from the spec's [env]): Python prints are read live"),
    ],
    ids=["key-off", "env-empty", "env-set"],
)  # fmt: skip
def test_the_record_says_who_decided_and_the_job_got_what_it_says(
    project: Project, extra: str, value: str | None, by: str, shown: str
) -> None:
    seen = project.root / "seen.json"
    spec = project.spec(
        f"""
        import json, os
        json.dump({{"value": os.environ.get("PYTHONUNBUFFERED")}}, open({str(seen)!r}, "w"))
        """,
        extra=extra,
    )
    proc = subprocess.run(
        [PYTHON, "-m", "acceptrun", "--workspace", str(project.workspace), "run", str(spec)],
        cwd=project.root, env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(seen.read_text())["value"] == value  # what the job really had
    record = project.only_record()
    assert record.state["python_unbuffered"] == {"value": value, "by": by}
    assert shown in project.cli("show", record.run_id, check_rc=0).stdout
