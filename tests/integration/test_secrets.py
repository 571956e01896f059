"""Secrets planted in a real run appear nowhere acceptrun writes or shows.

Planted: secret-looking environment variables (HF_TOKEN, AWS_SECRET_ACCESS_KEY,
WANDB_API_KEY, a *_PASSWORD, GITHUB_TOKEN) and one from the spec's own [env] table, a git
remote with user:password, a command line with ``--api-key X`` and ``--token=X``, and a
workload that fails with all of them (and a URL with credentials) in its traceback, so that
the stderr tail is quoted as failure evidence. Then every reading and exporting command
runs. Searched: every file of the record but the workload's own logs (stdout.log,
stderr.log: its output, kept whole), the user's spec (spec.toml: what they wrote, which
``acceptrun reproduce`` needs) and the code diff (git.diff: their code); every command's
output; the MLflow store and its artifacts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.campaign import tally

from conftest import toml_str

pytestmark = pytest.mark.slow

SECRETS = {
    "HF_TOKEN": "hf_SEKRIT0ENV0HF0aaaa",
    "AWS_SECRET_ACCESS_KEY": "SEKRIT0ENV0AWS0bbbb",
    "WANDB_API_KEY": "SEKRIT0ENV0WANDB0cccc",
    "MY_DB_PASSWORD": "SEKRIT0ENV0PW0dddd",
    "GITHUB_TOKEN": "ghp_SEKRIT0ENV0GH0eeee",
}
SPEC_ENV_SECRET = "SEKRIT0SPECENV0ffff"
ARG_KEY, ARG_TOKEN = "SEKRIT0ARG0KEY0gggg", "SEKRIT0ARG0TOKEN0hhhh"
REMOTE_PASSWORD = "SEKRIT0REMOTE0iiii"
URL_PASSWORD = "SEKRIT0URL0jjjj"
HYDRA_KEY = "SEKRIT0HYDRA0kkkk"  # trainer.api_key=... in the command
CLEANUP_TOKEN = "SEKRIT0CLEAN0llll"  # --token ... in a cleanup command
SIG = "SEKRIT0SIG0mmmm"  # a presigned URL's signature, in the description
EXC_PASSWORD, CONN_KEY = "SEKRIT0EXC0nnnn", "SEKRIT0CONN0oooo"  # in the exception text
MARK = "SEKRIT0"  # every planted value contains it

TRAIN = f"""
import os, sys
import acceptrun

run = acceptrun.init()
for step in run.steps(0, 4):
    run.log(step, loss=1.0 / (step + 1))
    if step == 2:
        found = [os.environ[k] for k in {sorted(SECRETS)!r} + ["API_TOKEN"]]
        print("argv", sys.argv, file=sys.stderr)
        raise RuntimeError(
            "401 Unauthorized: " + " ".join(found)
            + " at https://alice:{URL_PASSWORD}@hub.example.com/models"
            + " with Authorization: Bearer " + os.environ["HF_TOKEN"]
            + " password={EXC_PASSWORD} AccountKey={CONN_KEY};EndpointSuffix=x"
        )
"""


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=cwd, check=True, capture_output=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def leaky_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp_path = tmp_path_factory.mktemp("leaky")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN)
    command = ["python", "train.py", f"trainer.api_key={HYDRA_KEY}", "--api-key", ARG_KEY,
               f"--token={ARG_TOKEN}", "--lr", "0.1"]  # fmt: skip
    (proj / "spec.toml").write_text(
        f"name = 'leaky'\ncommand = {json.dumps(command)}\n"
        f"description = {toml_str(f'weights at https://h/w?se=1&sig={SIG}')}\n"
        f"[env]\nAPI_TOKEN = {toml_str(SPEC_ENV_SECRET)}\n"
        "[limits]\nmax_restarts = 0\n"
        f"[cleanup]\ncommands = [{toml_str(f'echo done --token {CLEANUP_TOKEN}')}]\n"
    )
    _git(proj, "init", "-q")
    _git(proj, "remote", "add", "origin", f"https://bob:{REMOTE_PASSWORD}@git.example.com/x.git")
    _git(proj, "add", "-A")
    _git(proj, "commit", "-qm", "init")
    ws = tmp_path / "ws"
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, **SECRETS, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("ACCEPTRUN_INJECT", None)
    outputs: list[str] = []

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "acceptrun", "--workspace", str(ws), *args],
            cwd=proj, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        outputs.append(f"$ acceptrun {' '.join(args)}\n{proc.stdout}\n{proc.stderr}")
        return proc

    # -q: the workload's own output is not echoed (it is its output, as in stderr.log).
    run = cli("run", "-q", "spec.toml")
    assert run.returncode == 1, run.stderr  # rejected: the workload failed
    for args in (
        ("ls",),
        ("show", "latest"),
        ("show", "latest", "--json"),
        ("report", "latest"),
        ("report", "latest", "--format", "md"),
        ("report", "latest", "--format", "json"),
        ("howto", "latest"),
        ("logs", "latest", "--stderr-only"),
        ("cost", "show", "latest"),
        ("env", "diff", "latest", "latest"),
        ("export", "mlflow", "latest", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"),
    ):
        proc = cli(*args)
        assert proc.returncode in (0, 1), f"{args}: {proc.stderr}"
    return {"ws": ws, "tmp": tmp_path, "outputs": outputs}


def test_no_planted_secret_reaches_the_record_the_reports_or_the_exports(
    leaky_run: dict[str, object],
) -> None:
    ws, tmp = Path(str(leaky_run["ws"])), Path(str(leaky_run["tmp"]))
    [record] = list((ws / "runs").iterdir())
    own = {"stdout.log", "stderr.log", "spec.toml", "git.diff"}
    searched, leaks = 0, []
    places = [p for p in record.rglob("*") if p.is_file() and p.name not in own]
    places += [p for p in tmp.glob("mlflow*") if p.is_file()]
    places += [p for p in tmp.rglob("mlruns/**/*") if p.is_file()]
    places += [p for p in ws.rglob("*") if p.is_file() and record not in p.parents]
    for path in places:
        searched += 1
        if MARK.encode() in path.read_bytes():
            leaks.append(str(path.relative_to(tmp)))
    outputs = [o for o in leaky_run["outputs"] if "acceptrun logs" not in o.splitlines()[0]]  # type: ignore[attr-defined]
    leaks += [o.splitlines()[0] for o in outputs if MARK in o]
    tally("secrets in env/args/output", tried=searched, secrets=len(leaks))
    assert searched > 10
    assert not leaks, f"planted secrets found in: {leaks}"


def test_the_evidence_is_still_quoted_with_the_secrets_redacted(
    leaky_run: dict[str, object],
) -> None:
    ws = Path(str(leaky_run["ws"]))
    [record] = list((ws / "runs").iterdir())
    # The workload's own log keeps everything (it is its output, for its owner)...
    stderr = (record / "attempts" / "1" / "stderr.log").read_text()
    assert SECRETS["HF_TOKEN"] in stderr and ARG_KEY in stderr
    # ...while what acceptrun quotes from it names the failure and hides the secrets.
    verdict = (record / "verdict.json").read_text()
    assert "401 Unauthorized" in verdict and "<redacted>" in verdict
    events = (record / "events.jsonl").read_text()
    start = next(json.loads(line) for line in events.splitlines() if '"attempt_start"' in line)
    assert start["command"][-5:] == ["--api-key", "<redacted>", "--token=<redacted>", "--lr", "0.1"]
    provenance = json.loads((record / "provenance.json").read_text())
    git = provenance.get("git") or {}
    assert "<redacted>@git.example.com" in str(git.get("remote"))
