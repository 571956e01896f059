"""No silent no-ops: keys that cannot act for the command warn, keys that would make the
verdict lie refuse, and commands that need the client refuse a black box up front."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from acceptrun.cli.main import main
from acceptrun.record.workspace import RunRecord
from acceptrun.workload.usage import BLACK_BOX
from conftest import PYTHON, Project, wait_for

BLACK_BOX_SCRIPT = "print('iter 1: loss 0.5')\n"


@pytest.fixture
def spec_check(
    project: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[[Path], tuple[int, str, str]]:
    """``acceptrun spec check SPEC`` through the CLI's own ``main``, in the project root:
    (exit status, stdout, stderr). A spec check starts nothing and reads only files, so
    a process of its own would add nothing but its start-up (a second of CPU)."""

    def check(spec: Path) -> tuple[int, str, str]:
        monkeypatch.chdir(project.root)
        capsys.readouterr()
        rc = main(["--workspace", str(project.workspace), "spec", "check", str(spec)])
        out, err = capsys.readouterr()
        return rc, out, err

    return check


CLIENT_SCRIPT = """
import acceptrun
run = acceptrun.init()
for step in run.steps(2):
    run.log(step, loss=0.5)
"""


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        pytest.param('[checkpoint]\ndir = "ck"\n', "checkpoint.dir", id="dir"),
        pytest.param('[checkpoint]\nmirror = "/tmp/m"\n', "checkpoint.mirror", id="mirror"),
        pytest.param("[checkpoint]\nevery_steps = 100\n", "checkpoint.every_steps", id="steps"),
        pytest.param('[checkpoint]\nevery = "30m"\n', "checkpoint.every", id="every"),
        pytest.param(
            '[checkpoint]\nkeep_best = "eval/loss:min"\n', "checkpoint.keep_best", id="best"
        ),
        pytest.param("[limits]\nmax_loss = 10.0\n", "limits.max_loss", id="max_loss"),
        pytest.param(
            "[acceptance]\nthroughput = [1, 2]\n", "acceptance.throughput", id="throughput"
        ),
        pytest.param('[acceptance]\ndrills = ["kill"]\n', "acceptance.drills", id="kill-drill"),
        pytest.param(
            '[acceptance]\nmetrics = { "eval/acc" = ">= 0.9" }\n',
            "acceptance.metrics",
            id="metrics",
        ),
    ],
)
def test_a_key_with_no_effect_on_a_black_box_warns(
    project: Project, spec_check: Callable[[Path], tuple[int, str, str]], extra: str, key: str
) -> None:
    spec = project.spec(BLACK_BOX_SCRIPT, extra=extra)
    rc, out, err = spec_check(spec)
    assert rc == 0, (out, err)
    assert f"warning: {key}: " in err
    assert "work.py does not use the client API" in err
    assert "1 warning(s)" in out


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param('[checkpoint]\nevery_steps = 100\ndir = "ck"\n', id="client-checkpoints"),
        pytest.param("[limits]\nmax_loss = 10.0\n", id="client-max-loss"),
        pytest.param("[acceptance]\nthroughput = [1, 2]\n", id="client-throughput"),
    ],
)
def test_the_same_keys_are_quiet_for_a_client_script(
    project: Project, spec_check: Callable[[Path], tuple[int, str, str]], extra: str
) -> None:
    spec = project.spec(CLIENT_SCRIPT, extra=extra)
    rc, out, err = spec_check(spec)
    assert rc == 0, (out, err)
    assert "warning" not in err


def test_watched_checkpoints_and_a_loss_pattern_make_the_keys_count(
    project: Project, spec_check: Callable[[Path], tuple[int, str, str]]
) -> None:
    spec = project.spec(
        BLACK_BOX_SCRIPT,
        extra="""
        [checkpoint]
        watch = ["out/ckpt.pt"]
        resume_args = ["--resume", "{checkpoint}"]
        every_steps = 100
        [limits]
        max_loss = 10.0
        [progress]
        pattern = 'iter (?P<step>\\d+): loss (?P<loss>\\S+)'
        [acceptance]
        drills = ["restore"]
        """,
    )
    rc, out, err = spec_check(spec)
    assert rc == 0, (out, err)
    assert "warning" not in err


def test_a_pattern_without_a_loss_group_does_not_feed_max_loss(
    project: Project, spec_check: Callable[[Path], tuple[int, str, str]]
) -> None:
    spec = project.spec(
        BLACK_BOX_SCRIPT,
        extra="[limits]\nmax_loss = 10.0\n[progress]\npattern = 'iter (?P<step>\\d+)'\n",
    )
    rc, out, err = spec_check(spec)
    assert rc == 0, (out, err)
    assert "warning: limits.max_loss" in err and "(?P<loss>" in err


def test_a_pattern_beside_tensorboard_is_refused_before_a_run(project: Project) -> None:
    """Both sources once meant the TensorBoard scalars never reached the record, silently."""
    spec = project.spec(
        BLACK_BOX_SCRIPT,
        extra="[progress]\npattern = 'iter (?P<step>\\d+)'\ntensorboard = 'tb'\n",
    )
    for args in (("spec", "check", str(spec)), ("run", str(spec))):
        proc = project.cli(*args, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert "progress.tensorboard: 'tb' is set beside progress.pattern" in proc.stderr
        assert "keep one" in proc.stderr
    assert project.run_ids() == []


def test_a_required_restore_drill_on_a_black_box_is_an_error(project: Project) -> None:
    spec = project.spec(BLACK_BOX_SCRIPT, extra='[acceptance]\ndrills = ["restore"]\n')
    for args in (("spec", "check", str(spec)), ("run", str(spec))):
        proc = project.cli(*args, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert "acceptance.drills" in proc.stderr
        assert "checkpoint.watch and checkpoint.resume_args" in proc.stderr
    assert project.run_ids() == []


def test_launch_prints_and_records_warnings_and_the_verdict_shows_them(project: Project) -> None:
    spec = project.spec(BLACK_BOX_SCRIPT, extra="[checkpoint]\nevery_steps = 100\n")
    proc = project.cli("run", str(spec), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "warning: checkpoint.every_steps" in proc.stderr
    record = project.only_record()
    (usage,) = record.events("usage")
    assert usage["usage"] == BLACK_BOX
    (warning,) = record.events("spec_warning")
    assert warning["key"] == "checkpoint.every_steps" and "checkpoint.watch" in warning["fix"]
    checks = json.loads((record.path / "verdict.json").read_text())["checks"]
    (info,) = [c for c in checks if c["name"] == "spec checkpoint.every_steps"]
    assert not info["required"] and "has no effect" in info["evidence"]


def test_drill_refuses_a_black_box_before_the_reference_run(project: Project) -> None:
    spec = project.spec(BLACK_BOX_SCRIPT)
    proc = project.cli("drill", str(spec), timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "watches no checkpoint" in proc.stderr and "checkpoint.watch" in proc.stderr
    assert project.run_ids() == []  # no reference run was started


def test_ckpt_drill_refuses_a_black_box_run(project: Project) -> None:
    spec = project.spec(BLACK_BOX_SCRIPT)
    assert project.cli("run", str(spec), timeout=120).returncode == 0
    record = project.only_record()
    proc = project.cli("ckpt", "drill", record.run_id, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "is a black box" in proc.stderr and "checkpoint.watch" in proc.stderr
    assert not (record.path / "drills").exists()


@pytest.mark.slow
def test_stop_of_a_black_box_promises_no_checkpoint(project: Project) -> None:
    spec = project.spec(
        "import time\nwhile True:\n    time.sleep(0.05)\n",
        extra='[limits]\ngrace_period = "1s"\n',
    )
    proc = subprocess.Popen(
        [PYTHON, "-m", "acceptrun", "--workspace", str(project.workspace), "run", str(spec)],
        cwd=project.root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def started() -> RunRecord | None:
            ids = project.run_ids()
            record = RunRecord(project.runs_dir / ids[0]) if ids else None
            return record if record and list(record.events("attempt_start")) else None

        record = wait_for(started, timeout=60, what="the attempt to start")
        stop = project.cli("stop", record.run_id, "--wait", timeout=120)
        assert stop.returncode == 0, stop.stderr  # the run closed
        assert "no checkpoint is taken" in stop.stderr
        assert "SIGKILL after the grace period (1.0s)" in stop.stderr
        assert "checkpoints at its next step boundary" not in stop.stderr
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
