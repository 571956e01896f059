"""The ``acceptrun`` command: bad input, preflight stops, spec tools, listing, data, imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from acceptrun.record.workspace import RunRecord
from conftest import assert_no_run_left, assert_one_message, run_main

PYTHON = sys.executable


# ---- bad input: exit 2, one message, no run record -------------------------------------------


def test_missing_spec_file_as_a_real_process(project: Any) -> None:
    proc = project.cli("run", "nope.toml", check_rc=2)

    message = assert_one_message(proc.stderr, "SpecError")
    assert "nope.toml" in message and "file not found" in message
    assert "acceptrun init" in message
    assert_no_run_left(project)


def test_spec_check_reports_the_same_problems(project: Any) -> None:
    spec = project.spec(extra='[limits]\nwal_time = "1h"\n', command=[PYTHON, "-c", "pass"])

    proc = project.cli("spec", "check", str(spec), check_rc=2)

    assert "did you mean 'wall_time'" in proc.stderr
    assert not project.workspace.exists()


# ---- preflight stops: exit 2, a complete record, no attempt -----------------------------------


def test_changed_data_stops_the_run_with_a_complete_record(project: Any) -> None:
    data = project.root / "data"
    (data / "train").mkdir(parents=True)
    (data / "train" / "a.bin").write_bytes(b"a" * 1000)
    (data / "train" / "b.bin").write_bytes(b"b" * 1000)
    project.cli("data", "snapshot", "data", "-o", "data.manifest.json", check_rc=0)
    (data / "train" / "b.bin").write_bytes(b"B" * 1000)  # same size, other content
    spec = project.spec(
        "print('must not run')",
        extra='[data]\npath = "data"\nmanifest = "data.manifest.json"\n',
    )

    proc = project.cli("run", str(spec), check_rc=2)

    assert "train/b.bin" in proc.stdout + proc.stderr
    assert "REJECTED" in proc.stdout
    rec = project.only_record()
    assert rec.state["status"] == "failed_preflight"
    assert rec.state["verdict"] == "rejected"
    pre = rec.read_json("preflight.json")
    assert pre["ok"] is False
    (check,) = [c for c in pre["checks"] if c["name"] == "data"]
    assert not check["ok"] and "train/b.bin" in check["message"]
    verdict = rec.read_json("verdict.json")
    assert verdict["verdict"] == "rejected" and "data verified" in verdict["failed"]
    assert rec.exists("provenance.json") and rec.exists("spec.toml")
    assert not (rec.path / "attempts").exists()
    assert "preflight_failed" in [e["kind"] for e in rec.events()]
    assert "must not run" not in proc.stdout


def test_unmet_expectation_stops_the_run(project: Any) -> None:
    spec = project.spec(
        "print('must not run')",
        extra='[expect]\npython = "<3.0"\n',
    )

    proc = project.cli("run", str(spec), check_rc=2)

    rec = project.only_record()
    pre = rec.read_json("preflight.json")
    (check,) = [c for c in pre["checks"] if c["name"] == "expectations"]
    assert not check["ok"]
    found = ".".join(map(str, sys.version_info[:3]))
    assert "expected <3.0" in check["message"] and f"found {found}" in check["message"]
    (row,) = check["details"]["rows"]
    assert (row["what"], row["expected"], row["found"], row["ok"]) == (
        "python",
        "<3.0",
        found,
        False,
    )
    assert not (rec.path / "attempts").exists()
    assert rec.state["status"] == "failed_preflight"
    assert rec.read_json("verdict.json")["verdict"] == "rejected"
    assert "expected <3.0" in proc.stdout


# ---- ls, show, index ------------------------------------------------------------------------------


def test_ls_show_and_index_rebuild(project: Any) -> None:
    before = project.cli("ls", check_rc=2)  # no workspace yet: say so, create nothing
    assert "not a directory" in assert_one_message(before.stderr, "WorkspaceError")
    assert not project.workspace.exists()
    project.runs_dir.mkdir(parents=True)
    assert "no runs yet" in project.cli("ls", check_rc=0).stdout

    # Names sort like start times: run ids have 1 s resolution, then the name.
    ok = project.spec("print('fine')", name="a-good-run", file="good.toml")
    bad = project.spec(
        "import sys; sys.exit(5)",
        name="b-bad-run",
        file="bad.toml",
        extra="[limits]\nmax_restarts = 0\n",
    )
    project.cli("run", "-q", str(ok), check_rc=0)
    project.cli("run", "-q", str(bad), check_rc=1)

    ls = project.cli("ls", check_rc=0)
    lines = ls.stdout.splitlines()
    assert lines[0].split() == ["RUN", "STATUS", "VERDICT", "ATT", "DURATION"]
    assert len(lines) == 3
    assert "good-run" in lines[1] and "accepted" in lines[1]
    assert "bad-run" in lines[2] and "rejected" in lines[2] and "finished" in lines[2]

    show = project.cli("show", "latest", check_rc=0)
    latest = project.run_ids()[-1]
    assert latest in show.stdout and "bad-run" in latest
    show_json = json.loads(project.cli("show", "latest", "--json", check_rc=0).stdout)
    assert show_json["state"]["run_id"] == latest
    assert show_json["verdict"]["verdict"] == "rejected"

    (project.workspace / "index.sqlite").unlink()
    rebuilt = project.cli("index", "rebuild", check_rc=0)
    assert "indexed 2 runs" in rebuilt.stdout
    assert project.cli("ls", check_rc=0).stdout == ls.stdout


def test_show_of_an_unknown_run_names_it(project: Any) -> None:
    project.cli("run", "-q", str(project.spec("pass")), check_rc=0)

    proc = project.cli("show", "no-such-run", check_rc=2)

    message = assert_one_message(proc.stderr, "WorkspaceError")
    assert "'no-such-run'" in message and "acceptrun ls" in message


def test_the_reading_commands_take_a_run_by_its_directory(project: Any, tmp_path: Path) -> None:
    """show, report, diff, ckpt ls/verify, howto and portability take a record's path as
    well as its id: run from a directory with no workspace (a record copied off a
    cluster), with no --workspace, they read that record; a path that is not a record is
    named, with the fix."""
    project.cli("run", "-q", str(project.spec("pass")), check_rc=0)
    (run_id,) = project.run_ids()
    path = str(project.runs_dir / run_id)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "ACCEPTRUN_WORKSPACE"}

    def cli(*args: str, rc: int | None = 0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [PYTHON, "-m", "acceptrun", *args], cwd=elsewhere, env=env,
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert rc is None or proc.returncode == rc, (
            args,
            proc.returncode,
            proc.stdout,
            proc.stderr,
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    assert json.loads(cli("show", path, "--json").stdout)["state"]["run_id"] == run_id
    assert cli("report", path, "--format", "json").stdout.strip().startswith("{")
    assert run_id in cli("diff", path, path, rc=1).stdout  # nothing to compare: not reproduced
    assert "no checkpoints" in cli("ckpt", "ls", path).stdout
    cli("howto", path)
    port = cli("portability", path, rc=None)  # 1 when it finds a blocker: either is an answer
    assert port.returncode in (0, 1) and run_id in port.stdout, port.stdout + port.stderr
    relative = os.path.relpath(path, elsewhere)
    assert json.loads(cli("show", relative, "--json").stdout)["state"]["run_id"] == run_id
    missing = cli("show", str(tmp_path / "no-such"), rc=2)
    assert "does not exist" in assert_one_message(missing.stderr, "WorkspaceError")
    not_record = cli("show", str(tmp_path), rc=2)
    assert "not a run record" in assert_one_message(not_record.stderr, "WorkspaceError")


# ---- imports -----------------------------------------------------------------------------------


def test_help_does_not_import_torch(tmp_path: Path) -> None:
    proc = subprocess.run(
        [PYTHON, "-X", "importtime", "-m", "acceptrun", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=tmp_path,
    )
    assert "usage: acceptrun" in proc.stdout
    imported = [line for line in proc.stderr.splitlines() if "import time:" in line]
    assert any("acceptrun.cli.main" in line for line in imported)  # the trace is real
    assert not [line for line in imported if "torch" in line]
    # Every command pays for what the start-up imports (docs/architecture.md, Tests): the
    # client and the board's server load only when a script or `acceptrun ui` needs them.
    names = {line.rsplit("|", 1)[-1].strip() for line in imported}
    heavy = {"acceptrun.workload.run", "acceptrun.ui.server", "acceptrun.report.html",
             "acceptrun.report.data"}  # fmt: skip
    assert not names & heavy


def test_importing_acceptrun_does_not_import_torch() -> None:
    subprocess.run(
        [PYTHON, "-c", "import acceptrun, sys; assert 'torch' not in sys.modules"],
        check=True,
        timeout=300,
    )


# ---- data ----------------------------------------------------------------------------------------


def test_data_snapshot_and_verify_round_trip(project: Any) -> None:
    data = project.root / "data"
    (data / "sub").mkdir(parents=True)
    (data / "x.txt").write_text("x" * 100)
    (data / "sub" / "y.txt").write_text("y" * 50)

    snap = project.cli("data", "snapshot", "data", "-o", "m.json", check_rc=0)
    assert "2 files" in snap.stdout and "150 bytes" in snap.stdout
    manifest = json.loads((project.root / "m.json").read_text())
    assert manifest["count"] == 2

    project.cli("data", "verify", "data", "m.json", check_rc=0)

    (data / "sub" / "y.txt").write_text("Y" * 50)
    changed = project.cli("data", "verify", "data", "m.json", check_rc=2)
    assert "sub/y.txt" in changed.stdout + changed.stderr
    assert "x.txt" not in (changed.stdout + changed.stderr).replace("sub/y.txt", "")


def test_snapshot_into_the_data_dir_leaves_the_manifest_out(project: Any) -> None:
    data = project.root / "data"
    data.mkdir()
    (data / "x.txt").write_text("x")

    project.cli("data", "snapshot", "data", "-o", "data/MANIFEST.json", check_rc=0)
    project.cli("data", "verify", "data", "data/MANIFEST.json", check_rc=0)
    assert json.loads((data / "MANIFEST.json").read_text())["count"] == 1


def test_run_record_of_an_accepted_run_via_main(
    project: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = project.spec("print('via main')")

    code, out, err = run_main(capsys, "--workspace", str(project.workspace), "run", str(spec))

    assert code == 0, err
    assert "ACCEPTED" in out and "via main" in out
    rec = project.only_record()
    assert isinstance(rec, RunRecord) and f"record: {rec.path}" in out
    assert f"run {rec.run_id}" in err  # progress lines go to stderr
