"""The client API in a real process: standalone runs, events, outputs, metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from acceptrun._util.durable import read_jsonl
from acceptrun.record.steplog import StepLog


def run_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def only_run(tmp_path: Path) -> Path:
    (run_dir,) = (tmp_path / ".acceptrun" / "runs").iterdir()
    return run_dir


def test_standalone_script_creates_a_complete_record(tmp_path: Path) -> None:
    proc = run_script(
        tmp_path,
        """
        import time
        import acceptrun
        import numpy as np
        run = acceptrun.init()
        for step in run.steps(5):
            with run.data_wait():
                time.sleep(0.01)
            run.log(step, loss=np.float32(1.0 / (step + 1)), samples=4)
        run.metric("eval/accuracy", np.float64(0.75))
        open("model.bin", "wb").write(b"weights")
        run.output("model", "model.bin", copy=True)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run(tmp_path)
    assert run_dir.name.split("-")[2] == "train"
    events = list(read_jsonl(run_dir / "events.jsonl"))
    assert not any(e["kind"] == "step" for e in events)  # steps go to the step log
    steps = StepLog(run_dir).events()
    assert [e["step"] for e in steps] == [0, 1, 2, 3, 4]
    assert all(e["data_wait"] >= 0.009 and e["step_time"] >= e["data_wait"] for e in steps)
    assert steps[-1]["loss"] == float(np.float32(0.2))  # the float32 value, exactly
    (output,) = [e for e in events if e["kind"] == "output"]
    assert Path(output["path"]) == run_dir / "outputs" / "model" / "model.bin"
    assert output["hash"].startswith("xxh3_128:") and output["size"] == 7
    state = json.loads((run_dir / "run.json").read_text())
    assert state["mode"] == "standalone" and state["verdict"] == "accepted"
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["accepted"] is True
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["python"]["executable"] == sys.executable


def test_standalone_crash_is_rejected_with_the_error(tmp_path: Path) -> None:
    proc = run_script(
        tmp_path,
        """
        import acceptrun
        run = acceptrun.init(name="crashy")
        for step in run.steps(3):
            run.log(step, loss=1.0)
        raise ValueError("bad batch shape")
        """,
    )
    assert proc.returncode == 1
    assert "ValueError: bad batch shape" in proc.stderr
    run_dir = only_run(tmp_path)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["accepted"] is False
    exit_check = next(c for c in verdict["checks"] if c["name"] == "exit")
    assert exit_check["status"] == "fail"
    assert "ValueError: bad batch shape" in exit_check["evidence"]


def test_log_outside_steps_times_from_previous_call(tmp_path: Path) -> None:
    proc = run_script(
        tmp_path,
        """
        import time
        import acceptrun
        run = acceptrun.init()
        for step in range(3):
            time.sleep(0.02)
            run.log(step, loss=0.1)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    steps = StepLog(only_run(tmp_path)).events()
    assert [e["step"] for e in steps] == [0, 1, 2]
    assert "step_time" not in steps[0]
    assert all(e["step_time"] >= 0.015 for e in steps[1:])


def test_log_refuses_the_step_events_own_names_and_keeps_the_values_logged(
    tmp_path: Path,
) -> None:
    proc = run_script(
        tmp_path,
        """
        import numpy as np
        import acceptrun
        run = acceptrun.init()
        run.log(0, loss=np.float32(0.5), lr=np.float64(0.1), flag=True)
        run.log(1, loss=0.25, lr=0.1, flag=False)
        for name in ("t", "kind", "attempt"):
            try:
                run.log(2, **{name: 1.0})
            except ValueError as exc:
                print("refused", name, exc)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("t", "kind", "attempt"):
        assert f"refused {name} run.log: ['{name}'] name the step event's own" in proc.stdout
    steps = StepLog(only_run(tmp_path)).events()
    assert [(e["step"], e["loss"], e["lr"], e["flag"]) for e in steps] == [
        (0, 0.5, 0.1, 1),
        (1, 0.25, 0.1, 0),
    ]


def test_output_that_changes_after_registration_fails_the_verdict(tmp_path: Path) -> None:
    proc = run_script(
        tmp_path,
        """
        import acceptrun
        run = acceptrun.init()
        open("model.bin", "wb").write(b"v1")
        run.output("model", "model.bin")
        open("model.bin", "wb").write(b"v2 written later")
        """,
    )
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads((only_run(tmp_path) / "verdict.json").read_text())
    check = next(c for c in verdict["checks"] if c["name"] == "output model")
    assert check["status"] == "fail"
    assert "changed after it was registered" in check["evidence"]


def test_missing_output_file_is_a_clear_error(tmp_path: Path) -> None:
    proc = run_script(
        tmp_path,
        """
        import acceptrun
        run = acceptrun.init()
        run.output("model", "nowhere.bin")
        """,
    )
    assert proc.returncode == 1
    assert (
        "output 'model':" in proc.stderr
        and "is not a file; write it before run.output()" in proc.stderr
    )
