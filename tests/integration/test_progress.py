"""Progress of an unmodified script: step events from its log lines and TensorBoard files.

Every test runs a real ``acceptrun run`` on a script that never imports acceptrun.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import subprocess
from typing import Any

import pytest

from acceptrun.cost.ledger import build_ledger
from acceptrun.record.workspace import RunRecord
from acceptrun.report.top import run_row
from acceptrun.telemetry.summary import summarize
from acceptrun.telemetry.timelines import timelines
from conftest import PYTHON, Project, wait_for

PATTERN = r"'iter (?P<step>\d+): loss (?P<loss>\S+)'"
# A number group that cannot match "nan": a diverged line must still be seen.
TOTAL_PATTERN = r"'iter (?P<step>\d+)/(?P<total_steps>\d+): loss (?P<loss>\S+)'"
NUMBER_PATTERN = r"'iter (?P<step>\d+): loss (?P<loss>[0-9.eE+-]+)'"


def events(record: RunRecord, kind: str) -> list[dict[str, Any]]:
    return list(record.events(kind))


def exit_json(record: RunRecord, attempt: int = 1) -> dict[str, Any]:
    return json.loads((record.path / "attempts" / str(attempt) / "exit.json").read_text())


def test_log_lines_become_steps_with_loss_and_compute_time(project: Project) -> None:
    spec = project.spec(
        """
        import time
        time.sleep(0.3)  # start-up
        for i in range(1, 41):
            time.sleep(0.02)
            print(f"iter {i}/40: loss {2.0 / i:.5f}", flush=True)
            if i % 10 == 0:
                print("eval: not a step line", flush=True)
        """,
        extra=f'[progress]\npattern = {TOTAL_PATTERN}\nstream = "stdout"\n',
    )
    proc = project.cli("run", str(spec), timeout=120)
    assert proc.returncode == 0, proc.stderr
    record = project.only_record()
    steps = events(record, "step")
    assert [s["step"] for s in steps] == list(range(1, 41))
    assert {s["source"] for s in steps} == {"log"}
    assert steps[-1]["loss"] == pytest.approx(0.05)
    assert "step_time" not in steps[0]  # nothing before the first line to time it from
    assert all(s["step_time"] >= 0 for s in steps[1:])
    summary = summarize(record.path)
    assert summary.steps == 40
    assert summary.step_time is not None
    bd = summary.breakdown
    # Printing 40 lines 20 ms apart is compute; the 0.3 s sleep before the first line is not.
    assert bd["compute"] > 0.5
    assert bd["before_first_step"] >= 0.3
    losses = [s["loss"] for s in timelines(record.path)["steps"]]
    assert losses[0] == pytest.approx(2.0) and losses[-1] == pytest.approx(0.05)
    assert "No loss was logged" not in (record.path / "report.html").read_text()
    row = run_row(record, record.state)  # what `acceptrun top` shows
    assert (row["step"], row["total_steps"]) == (40, 40) and row["throughput"] > 0


def test_a_line_every_n_steps_stands_for_n_steps(project: Project) -> None:
    spec = project.spec(
        """
        import time
        for i in range(0, 101):
            time.sleep(0.005)
            if i % 10 == 0:
                print(f"iter {i}: loss {1.0 / (i + 1):.5f}", flush=True)
        """,
        extra=f"[progress]\npattern = {PATTERN}\n",
    )
    assert project.cli("run", str(spec), timeout=120).returncode == 0
    steps = events(project.only_record(), "step")
    assert [s["step"] for s in steps] == list(range(0, 101, 10))
    assert all(s.get("span") == 10 for s in steps[1:])
    for prev, s in itertools.pairwise(steps):  # per step, not per line: a tenth of the time
        assert s["step_time"] == pytest.approx((s["t"] - prev["t"]) / 10, abs=1e-5)


@pytest.mark.slow
def test_hang_fires_when_the_script_stops_printing_step_lines(project: Project) -> None:
    spec = project.spec(
        """
        import os, time
        if os.environ["ACCEPTRUN_ATTEMPT"] == "1":
            for i in range(1, 6):
                print(f"iter {i}: loss 1.0", flush=True)
            while True:  # busy and chatty, but no step ever finishes again
                t = time.time()
                while time.time() - t < 0.1:
                    pass  # CPU use, then output: neither is a step
                print("still working", flush=True)
        print("iter 6: loss 0.5", flush=True)
        """,
        extra=f"""
        [progress]
        pattern = {PATTERN}
        [limits]
        hang_window = "10s"
        restart_backoff = "0s"
        max_restarts = 1
        """,
    )
    proc = project.cli("run", str(spec), timeout=120)
    assert proc.returncode == 0, proc.stderr
    record = project.only_record()
    hang = events(record, "hang_detected")
    assert len(hang) == 1 and hang[0]["stall"] == "hang"
    assert "no step line" in hang[0]["evidence"] and "last step 5" in hang[0]["evidence"]
    assert exit_json(record, 1)["class"] == "hang"


def test_nan_loss_line_diverges_and_stops_the_run(project: Project) -> None:
    spec = project.spec(
        """
        import time
        for i in range(1, 4):
            print(f"iter {i}: loss {1.0 / i}", flush=True)
        print("iter 4: loss nan", flush=True)
        while True:  # a black box that would go on training a diverged model
            time.sleep(0.05)
        """,
        extra=f"""
        [progress]
        pattern = {NUMBER_PATTERN}
        [limits]
        restart_backoff = "0s"
        """,
    )
    proc = project.cli("run", str(spec), timeout=120)
    assert proc.returncode == 1
    record = project.only_record()
    (div,) = events(record, "diverged")
    assert div["step"] == 4 and div["loss"] == "nan" and div["source"] == "log"
    assert "not finite" in div["reason"]
    ex = exit_json(record, 1)
    assert ex["class"] == "diverged" and ex["signal"] == "SIGKILL"
    assert not (record.path / "attempts" / "2").exists()  # diverged: not retried
    last_loss = events(record, "step")[-1]["loss"]  # the step log holds the NaN itself
    assert isinstance(last_loss, float) and math.isnan(last_loss)


def test_loss_above_max_loss_diverges(project: Project) -> None:
    spec = project.spec(
        """
        import time
        for i in range(1, 100):
            print(f"iter {i}: loss {i * 1.5}", flush=True)
            time.sleep(0.02)
        """,
        extra=f"""
        [progress]
        pattern = {PATTERN}
        [limits]
        max_loss = 10.0
        """,
    )
    assert project.cli("run", str(spec), timeout=120).returncode == 1
    (div,) = events(project.only_record(), "diverged")
    assert div["step"] == 7 and "above limits.max_loss = 10" in div["reason"]


@pytest.mark.slow
def test_lost_steps_after_a_kill_are_counted(project: Project) -> None:
    spec = project.spec(
        """
        import os, time
        steps = 10_000 if os.environ["ACCEPTRUN_ATTEMPT"] == "1" else 5
        for i in range(1, steps + 1):
            print(f"iter {i}: loss {1.0 / i:.5f}", flush=True)
            time.sleep(0.02)
        """,
        extra=f"""
        [progress]
        pattern = {PATTERN}
        [limits]
        restart_backoff = "0s"
        """,
    )
    proc = subprocess.Popen(
        [PYTHON, "-m", "acceptrun", "--workspace", str(project.workspace), "run", str(spec), "-q"],
        cwd=project.root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        record = wait_for(
            lambda: project.run_ids() and RunRecord(project.runs_dir / project.run_ids()[0]),
            timeout=60,
            what="the run record",
        )

        def steps_seen() -> bool:
            return len([s for s in record.events("step") if s.get("attempt") == 1]) >= 10

        wait_for(steps_seen, timeout=60, what="10 step events")
        (start,) = [e for e in record.events("attempt_start") if e["attempt"] == 1]
        os.kill(start["pid"], signal.SIGKILL)  # the workload, not the supervisor
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    ex = exit_json(record, 1)
    assert ex["class"] == "killed"
    last = ex["work"]["last_step"]
    assert last >= 10
    assert ex["work"]["steps_lost"] == last  # no checkpoint: every step is redone
    assert exit_json(record, 2)["work"]["last_step"] == 5


def test_injected_step_kill_fires_on_a_black_box_and_counts_lost_steps(project: Project) -> None:
    spec = project.spec(
        """
        import os, time
        steps = 10_000 if os.environ["ACCEPTRUN_ATTEMPT"] == "1" else 3
        for i in range(1, steps + 1):
            print(f"iter {i}: loss {1.0 / i:.5f}", flush=True)
            time.sleep(0.01)
        """,
        extra=f"""
        [progress]
        pattern = {PATTERN}
        [limits]
        restart_backoff = "0s"
        """,
    )
    proc = project.cli("run", "--inject", "kill@step=8", str(spec), timeout=120)
    assert proc.returncode == 0, proc.stderr
    record = project.only_record()
    (fault,) = record.events("fault_injected")
    assert fault["step"] == 8 and fault["by"] == "supervisor" and fault["seen_step"] >= 8
    ex = exit_json(record, 1)
    assert ex["class"] == "killed" and ex["signal"] == "SIGKILL"
    assert "injected fault kill@step=8" in ex["reason"]  # the supervisor sent it
    assert ex["work"]["steps_lost"] == ex["work"]["last_step"] >= 8
    assert exit_json(record, 2)["class"] == "success"


@pytest.mark.slow
def test_tensorboard_scalars_become_steps(project: Project) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("tensorboard")
    spec = project.spec(
        """
        import time
        from torch.utils.tensorboard import SummaryWriter
        w = SummaryWriter("tb/run1")
        for step in range(1, 21):
            time.sleep(0.02)
            w.add_scalar("train/loss", 1.0 / step, step)
            w.add_scalar("train/lr", 0.1, step)
            w.flush()
        w.close()
        """,
        extra="""
        [progress]
        tensorboard = "tb"
        tags = { loss = "train/loss" }
        """,
    )
    proc = project.cli("run", str(spec), timeout=300)
    assert proc.returncode == 0, proc.stderr
    steps = events(project.only_record(), "step")
    assert [s["step"] for s in steps] == list(range(1, 21))
    assert {s["source"] for s in steps} == {"tensorboard"}
    assert steps[-1]["loss"] == pytest.approx(0.05)
    assert "train/lr" not in steps[-1]  # tags name what is read
    assert all(s["step_time"] > 0 for s in steps[1:])


def test_black_box_without_steps_is_timed_by_its_activity(project: Project) -> None:
    spec = project.spec(
        """
        import time
        t = time.time()
        while time.time() - t < 2.5:  # trains the whole time, says nothing
            pass
        """,
        extra='[telemetry]\ninterval = "0.25s"\n',
    )
    assert project.cli("run", str(spec), timeout=120).returncode == 0
    record = project.only_record()
    assert not events(record, "step")
    bd = summarize(record.path).breakdown
    assert bd["compute"] >= 1.5
    (run_start,) = events(record, "run_start")
    (attempt_start,) = events(record, "attempt_start")
    preflight = attempt_start["t"] - run_start["t"]  # launch and preflight: how busy the machine is
    assert bd["before_first_step"] - preflight < bd["compute"]  # the script's own start-up
    ledger = build_ledger(record)
    assert ledger["compute"]["split_s"]["productive"] >= 1.5
    (attempt,) = ledger["compute"]["attempts"]  # the attempt itself, without launch and preflight
    assert attempt["split_s"]["productive"] > attempt["split_s"]["idle"]
    verdict = json.loads((record.path / "verdict.json").read_text())
    info = {c["name"]: c for c in verdict["checks"] if not c["required"]}
    assert "progress.pattern" in info["step time"]["evidence"]
    assert "checkpoint.watch" in info["checkpoints"]["evidence"]
    assert "[outputs]" in info["outputs"]["evidence"]
    assert "run.data_wait" in info["data wait"]["evidence"]


def test_progress_lines_are_not_read_for_a_client_script(project: Project) -> None:
    spec = project.spec(
        """
        import acceptrun
        run = acceptrun.init()
        for step in run.steps(3):
            print(f"iter {step}: loss 1.0", flush=True)
            run.log(step, loss=1.0)
        """,
        extra=f"[progress]\npattern = {PATTERN}\n",
    )
    proc = project.cli("run", str(spec), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "progress: has no effect" in proc.stderr
    steps = events(project.only_record(), "step")
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert all("source" not in s for s in steps)
