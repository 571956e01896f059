"""The record tells the truth: diff, workspace discovery and its .gitignore, provenance,
mirror retention, the ledger of CPU and failed-preflight runs, git-ignored data.

Real files, real git repositories and real ``acceptrun`` processes in ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PYTHON = sys.executable


def _git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd, check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return proc.stdout.strip()


def _acceptrun(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", *args],
        cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


# ---- 2 and 3. the workspace: at the project root, ignored by git, listed for the user ------------


def _project(root: Path) -> Path:
    """A committed repository with two jobs in sub-folders, each a spec and a script."""
    root.mkdir(parents=True)
    for job in ("a", "b"):
        d = root / "jobs" / job
        d.mkdir(parents=True)
        (d / "work.py").write_text("print('trained')\n")
        (d / "spec.toml").write_text(
            f'name = "{job}"\ncommand = [{json.dumps(PYTHON)}, "work.py"]\n'
        )
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "jobs")
    return root


@pytest.mark.slow
def test_workspace_is_created_at_the_repository_root_and_never_makes_it_dirty(
    tmp_path: Path, user_config: Path
) -> None:
    repo = _project(tmp_path / "proj")
    job_a = repo / "jobs" / "a"
    # No workspace anywhere up the tree, none named: the run creates it at the git root.
    proc = _acceptrun(job_a, "run", "-q", "spec.toml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws = repo / ".acceptrun"
    assert (ws / "runs").is_dir() and not (job_a / ".acceptrun").exists()
    assert (ws / ".gitignore").read_text().splitlines()[-1] == "*"
    # The run's own record did not make the repository dirty, nor is it in the run's provenance.
    assert _git(repo, "status", "--porcelain") == ""
    (run_a,) = [p for p in (ws / "runs").iterdir()]
    prov = json.loads((run_a / "provenance.json").read_text())
    assert prov["git"]["dirty"] is False and prov["git"]["diff_bytes"] == 0
    assert ".acceptrun" not in (run_a / "git.diff").read_text()

    # A spec in another folder of the same project, started from the repository root: same
    # workspace (one per project, not one per spec folder).
    proc = _acceptrun(repo, "run", "-q", "jobs/b/spec.toml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(list((ws / "runs").iterdir())) == 2

    # The user's list knows the workspace.
    listed = json.loads((user_config / "workspaces.json").read_text())
    assert str(ws) in [e["path"] for e in listed["workspaces"]]


@pytest.mark.slow
def test_an_existing_nearer_workspace_is_kept_and_learns_to_ignore_itself(tmp_path: Path) -> None:
    repo = _project(tmp_path / "proj")
    job_b = repo / "jobs" / "b"
    # A workspace made by an older acceptrun, beside the spec: no .gitignore, not committed.
    (job_b / ".acceptrun" / "runs").mkdir(parents=True)
    assert "jobs/b/.acceptrun" in _git(repo, "status", "--porcelain", "--untracked-files=all") or (
        _git(repo, "status", "--porcelain") == ""  # git lists no empty directory
    )
    proc = _acceptrun(job_b, "run", "-q", "spec.toml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(list((job_b / ".acceptrun" / "runs").iterdir())) == 1
    assert not (repo / ".acceptrun").exists()
    assert (job_b / ".acceptrun" / ".gitignore").is_file()
    assert _git(repo, "status", "--porcelain") == ""
    (run,) = list((job_b / ".acceptrun" / "runs").iterdir())
    assert json.loads((run / "provenance.json").read_text())["git"]["dirty"] is False


@pytest.mark.slow
def test_provenance_leaves_out_a_workspace_git_would_see(tmp_path: Path) -> None:
    from acceptrun.capture import provenance

    repo = _project(tmp_path / "proj")
    ws = repo / "records"  # a workspace named by --workspace, without its .gitignore
    (ws / "runs" / "r1").mkdir(parents=True)
    (ws / "runs" / "r1" / "run.json").write_text("{}")
    (repo / "jobs" / "a" / "notes.py").write_text("x = 1\n")  # a real untracked change
    diff = tmp_path / "git.diff"
    git = provenance.capture(cwd=repo, diff_path=diff, exclude=[ws])["git"]
    assert git["dirty"] is True
    text = diff.read_text()
    assert "jobs/a/notes.py" in text and "records" not in text
    os.remove(repo / "jobs" / "a" / "notes.py")
    assert provenance.capture(cwd=repo, exclude=[ws])["git"]["dirty"] is False


@pytest.mark.slow
def test_ls_all_and_cost_all_show_every_listed_workspace(tmp_path: Path) -> None:
    env = {"ACCEPTRUN_CONFIG_DIR": str(tmp_path / "config")}
    for project in ("vision", "speech", "gone"):
        d = tmp_path / project
        d.mkdir()
        (d / "work.py").write_text("print('trained')\n")
        (d / "spec.toml").write_text(
            f'name = "{project}-job"\ncommand = [{json.dumps(PYTHON)}, "work.py"]\n'
            "[cost]\nprice_per_hour = 3600\n"
        )
        proc = _acceptrun(d, "run", "-q", "spec.toml", env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (d / ".acceptrun" / "runs").is_dir()  # outside git: beside the spec
    subprocess.run(["rm", "-rf", str(tmp_path / "gone")], check=True)

    ls = _acceptrun(tmp_path, "ls", "--all", env=env)
    assert ls.returncode == 0, ls.stderr
    lines = ls.stdout.splitlines()
    assert lines[0].split()[:2] == ["PROJECT", "RUN"]
    rows = [line.split() for line in lines[1:] if not line.startswith("note:")]
    assert sorted(r[0] for r in rows) == ["speech", "vision"]
    assert all(r[2] == "finished" for r in rows), rows
    assert f"note: skipped {tmp_path / 'gone' / '.acceptrun'} (gone): it no longer exists" in lines

    cost = _acceptrun(tmp_path, "cost", "--all", env=env)
    assert cost.returncode == 0, cost.stderr
    table = {line.split()[0]: line.split() for line in cost.stdout.splitlines()[1:3]}
    assert set(table) == {"speech", "vision"}
    assert table["vision"][1:3] == ["1", "1"] and table["vision"][3] == "$60.00"  # a minute
    assert "all listed workspaces: 2 runs, 2 accepted" in cost.stdout
    assert re.search(r"^  total +\$120\.00$", cost.stdout, re.MULTILINE), cost.stdout
    assert "note: skipped" in cost.stdout
    as_json = json.loads(_acceptrun(tmp_path, "cost", "--all", "--json", env=env).stdout)
    assert as_json["total"]["runs"] == 2 and len(as_json["workspaces"]) == 2


# ---- 5. the ledger: CPU runs, a custom billing increment, a run that failed preflight ------------


def _priced_job(root: Path, name: str, cost: str, extra: str = "") -> Path:
    root.mkdir(parents=True)
    (root / "work.py").write_text("import time\ntime.sleep(0.2)\n")
    (root / "spec.toml").write_text(
        f'name = "{name}"\ncommand = [{json.dumps(PYTHON)}, "work.py"]\n[cost]\n{cost}\n{extra}'
    )
    return root / "spec.toml"


@pytest.mark.slow
def test_cpu_run_with_a_per_second_price_bills_seconds_and_no_gpu(tmp_path: Path) -> None:
    from acceptrun.cost.ledger import build_ledger
    from acceptrun.run.launch import launch

    spec = _priced_job(tmp_path / "job", "cpu", 'price_per_hour = 3600\nbilling_increment = "1s"')
    result = launch(spec, workspace=tmp_path / "ws", echo=False)
    ledger = build_ledger(result.record)
    assert ledger["gpus"] == 0 and ledger["device_seconds"] == 0
    assert ledger["price"]["increment_s"] == 1.0 and ledger["price"]["minimum_s"] == 0.0
    # Per second: the billed time is the wall time rounded up to a second, not a minute.
    assert ledger["billed_s"] == pytest.approx(-(-ledger["wall_s"] // 1))
    shown = _acceptrun(tmp_path, "--workspace", str(tmp_path / "ws"), "cost", "show")
    assert "a CPU run: 0 GPUs, no GPU-seconds" in shown.stdout, shown.stdout + shown.stderr
    assert "increments of 1 s" in shown.stdout


def test_billing_increment_is_refused_where_it_cannot_apply(tmp_path: Path) -> None:
    spec = _priced_job(
        tmp_path / "job", "x",
        'provider = "lambda"\ninstance = "gpu_1x_a10"\nbilling_increment = "1s"',
    )  # fmt: skip
    proc = _acceptrun(tmp_path, "spec", "check", str(spec))
    assert proc.returncode == 2
    assert "cost.billing_increment" in proc.stderr and "price_per_hour" in proc.stderr


@pytest.mark.slow
def test_verdict_cost_line_agrees_with_the_ledger_of_a_failed_preflight(tmp_path: Path) -> None:
    from acceptrun.cost.billing import format_usd
    from acceptrun.run.launch import launch
    from acceptrun.spec.model import format_duration

    spec = _priced_job(
        tmp_path / "job", "pf", "price_per_hour = 3600", '[expect]\npython = "<3.0"\n'
    )
    result = launch(spec, workspace=tmp_path / "ws", echo=False)
    assert result.exit_code == 2 and not result.verdict.accepted
    record = result.record
    ledger = record.read_json("ledger.json")  # the one written after the verdict
    assert ledger["status"] == "failed_preflight" and ledger["compute"]["attempts"] == []
    # No workload ran: nothing is billed as compute, and the verdict judges only the checks
    # that ran before the launch (no cost line to disagree with the ledger).
    assert ledger["billed_s"] == 0 and ledger["total_usd"] == 0, ledger
    names = {c["name"] for c in record.read_json("verdict.json")["checks"]}
    assert "cost" not in names and "expectations" in names, names
    assert format_usd(ledger["total_usd"]) and format_duration(ledger["billed_s"])


# ---- 4. retention applies to the mirror; the ledger counts the mirror's bytes ------------------


MIRRORED_WORK = """
import numpy as np
import acceptrun

weights = np.random.default_rng(0).normal(size=(64, 64)).astype(np.float32)
run = acceptrun.init()
start = run.restore(weights=weights)
for step in run.steps(start, 6):
    run.log(step, loss=1.0 / (step + 1))
    run.checkpoint(step, block=True)
"""


@pytest.mark.slow
def test_ledger_counts_the_mirror_apart_from_local_storage(tmp_path: Path) -> None:
    from acceptrun.cost.ledger import build_ledger
    from acceptrun.run.launch import launch

    job = tmp_path / "job"
    job.mkdir()
    (job / "work.py").write_text(MIRRORED_WORK)
    mirror_root = tmp_path / "mirror"
    (job / "spec.toml").write_text(
        f'name = "mirrored"\ncommand = [{json.dumps(PYTHON)}, "work.py"]\n'
        f"[checkpoint]\nkeep_last = 2\nmirror = {json.dumps(str(mirror_root))}\n"
        "[cost]\nprice_per_hour = 3600\nmirror_per_gib_month = 100.0\n"
    )
    result = launch(job / "spec.toml", workspace=tmp_path / "ws", echo=False)
    assert result.exit_code == 0, result.verdict
    record = result.record
    remote = mirror_root / record.run_id
    assert sorted(p.name for p in remote.iterdir() if p.is_dir()) == ["step-4", "step-5"]

    storage = build_ledger(record)["storage"]
    mirror = storage["mirror"]
    # Every upload is priced, from its mirror_ok; a step that retention removed locally
    # before its upload began is "skipped" (a newer one superseded it), which depends on
    # how fast the mirror thread ran, so the uploads are read from the record itself.
    uploaded = {e["step"] for e in record.events("mirror_ok")}
    assert {4, 5} <= uploaded <= {0, 1, 2, 3, 4, 5}
    assert {i["step"] for i in mirror["items"]} == uploaded
    on_remote = sum(
        p.stat().st_size
        for p in remote.rglob("*")
        if p.is_file() and p.name not in ("LATEST", "OWNER.json")  # the root's bookkeeping
    )
    assert mirror["left_bytes"] == on_remote > 0
    assert storage["left_behind"]["mirror_bytes"] == on_remote
    assert mirror["gib_hours"] > 0 and mirror["usd"] > 0 and mirror["priced"]
    assert storage["usd"] == pytest.approx(storage["local_usd"] + mirror["usd"])
    shown = _acceptrun(tmp_path, "--workspace", str(tmp_path / "ws"), "cost", "show")
    assert "storage here: checkpoints" in shown.stdout
    assert "storage in the mirror:" in shown.stdout, shown.stdout


# ---- 6. howto and portability notice what a clone lacks ------------------------------------------


@pytest.fixture(scope="module")
def ignored_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A repository whose data git ignores, with an uncommitted manifest and spec, and a run."""
    repo = tmp_path_factory.mktemp("ignored") / "proj"
    (repo / "data").mkdir(parents=True)
    (repo / "data" / "tokens.bin").write_bytes(b"\x01" * 1000)
    (repo / ".gitignore").write_text("data/\n")
    (repo / "work.py").write_text("print('trained')\n")
    spec = f'name = "ign"\ncommand = [{json.dumps(PYTHON)}, "work.py"]\n'
    spec += '[data]\npath = "data"\nmanifest = "data.manifest.json"\n'
    (repo / "spec.toml").write_text(spec)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "code")
    (repo / "draft.toml").write_text(spec.replace('"ign"', '"draft"'))  # never committed
    ws = repo.parent / "ws"
    snap = _acceptrun(repo, "data", "snapshot", "data", "-o", "data.manifest.json")
    assert snap.returncode == 0, snap.stderr
    proc = _acceptrun(repo, "--workspace", str(ws), "run", "-q", "draft.toml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_id,) = [p.name for p in (ws / "runs").iterdir()]
    return {"repo": repo, "ws": ws, "run": run_id}


def _findings(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {f["where"]: f for f in json.loads(proc.stdout)["findings"]}


@pytest.mark.slow
def test_portability_of_a_spec_file_names_ignored_data_and_uncommitted_files(
    ignored_data: dict[str, Any],
) -> None:
    repo = ignored_data["repo"]
    found = _findings(_acceptrun(repo, "portability", "--json", "spec.toml"))
    data = found["data.path"]
    assert data["severity"] == "warning" and data["value"] == "data"
    assert "git ignores it (.gitignore:1:data/)" in data["why"]
    assert "another engineer's clone does not have it" in data["why"]
    assert "object storage" in data["fix"] and "git add -f data" in data["fix"]
    manifest = found["data.manifest"]
    assert "not committed" in manifest["why"]
    assert manifest["fix"].startswith("`git add data.manifest.json && git commit`")
    assert "spec" not in found  # spec.toml is committed

    draft = _findings(_acceptrun(repo, "portability", "--json", "draft.toml"))
    assert "not committed" in draft["spec"]["why"] and draft["spec"]["value"] == "draft.toml"
    text = _acceptrun(repo, "portability", "spec.toml").stdout
    assert "move it: copy it to object storage" in text


@pytest.mark.slow
def test_portability_and_howto_of_a_run_say_what_a_clone_lacks(
    ignored_data: dict[str, Any],
) -> None:
    repo, ws, run = ignored_data["repo"], ignored_data["ws"], ignored_data["run"]
    found = _findings(_acceptrun(repo, "--workspace", str(ws), "portability", "--json", run))
    assert "git ignores it" in found["data.path"]["why"]
    assert "not committed" in found["data.manifest"]["why"]  # from the run's git.diff
    assert "not committed" in found["spec"]["why"]

    howto = _acceptrun(repo, "--workspace", str(ws), "howto", run)
    assert howto.returncode == 0, howto.stderr
    lines = howto.stdout.splitlines()
    assert any(
        line.startswith("# the data is inside the repository at data, but git ignores it")
        for line in lines
    ), howto.stdout
    assert any(line.startswith("rsync -a ") and line.endswith(" ./") for line in lines)
    assert any(line.startswith("scp ") and line.endswith(" data.manifest.json") for line in lines)
    assert any("the spec draft.toml is in the repository, but it was not committed" in line
               for line in lines)  # fmt: skip
    assert f"acceptrun run {run}.spec.toml" in lines
    assert "acceptrun run draft.toml" not in lines
