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

Then the issue's own URL examples, run for real: ``checkpoint.mirror =
"s3://user:PASSWORD@bucket/prefix"`` on a run that checkpoints and mirrors to an
S3-compatible server on loopback (the userinfo makes the bucket name invalid, so the
uploads fail: the mirror's events, mirror.json and the mirror check still name the url),
``data.path = "s3://user:PASSWORD@bucket/data"``, and a workload whose exception quotes
the bare mirror password (the workload process learns the spec's secrets from the
record's frozen spec, as the supervisor does). Searched: every file of those records and
their checkpoint stores but the tensors, every command's output, and every page of
``acceptrun ui`` (its routes from the board's own routing table) over that workspace.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.campaign import tally

from acceptrun.ui.server import ROUTES
from conftest import toml_str

pytestmark = pytest.mark.slow
# The S3 fixtures (tests/integration/s3server.py, on sys.path through pytest's pythonpath).
pytest_plugins = ["s3server"]
BUCKET = "acceptrun-test"  # s3server.BUCKET

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


def recording_cli(
    ws: Path, cwd: Path, env: dict[str, str], outputs: list[str]
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``acceptrun --workspace WS ARGS`` as a real process; each call's output kept in
    ``outputs``, for the tests that look for secrets in everything a command printed."""

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "acceptrun", "--workspace", str(ws), *args],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        outputs.append(f"$ acceptrun {' '.join(args)}\n{proc.stdout}\n{proc.stderr}")
        return proc

    return cli


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
    cli = recording_cli(ws, proj, env, outputs)

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


# ---- passwords in the spec's URL fields, and the board ---------------------------------------

MIRROR_PASSWORD = "SEKRIT0MIRROR0pppp"  # checkpoint.mirror = s3://user:THIS@bucket/prefix
DATA_PASSWORD = "SEKRIT0DATA0qqqq"  # data.path = s3://user:THIS@bucket/data
BOARD_TOKEN = "board-token-0123456789abcdef"
# The user's own files, kept whole by design: the workload's output, what they wrote, their code.
OWN_FILES = {"stdout.log", "stderr.log", "spec.toml", "git.diff"}
TENSORS = {
    ".safetensors",
    ".pt",
    ".bin",
    ".npy",
}  # checkpoint payloads: bytes, not acceptrun's text

MIRRORED = """
import json, os, time
import acceptrun

run = acceptrun.init()
state = {"w": [0.0]}
start = run.restore(state=state)
for step in run.steps(start, 6):
    state["w"][0] += 1.0
    run.log(step, loss=1.0 / (step + 1))
    run.maybe_checkpoint(step)
# The uploads fail (the userinfo makes the bucket name invalid) and are retried as an
# outage would be; the exit's 60 s drain would only repeat them. Once the last step's
# first try is on record, leave without it.
state_path = os.path.join(os.environ["ACCEPTRUN_RUN_DIR"], "mirror.json")
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        steps = json.load(open(state_path))["steps"]
    except (OSError, ValueError, KeyError):
        steps = {}
    if steps.get("5", {}).get("attempts", 0) >= 1:
        break
    time.sleep(0.05)
else:
    raise SystemExit("step 5 was never tried by the mirror")
os._exit(0)
"""
QUOTES = """
import sys
import acceptrun

run = acceptrun.init()
print("connecting with", sys.argv[1], file=sys.stderr)
raise RuntimeError("the store refused " + sys.argv[1])
"""


def _spec(name: str, command: list[str], extra: str) -> str:
    return (
        f"name = {toml_str(name)}\ncommand = {json.dumps(command)}\n"
        f"[limits]\nmax_restarts = 0\n{extra}"
    )


@pytest.fixture(scope="module")
def url_runs(s3: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three runs in one workspace: a mirrored one, a data one, one quoting the password."""
    tmp = tmp_path_factory.mktemp("urls")
    proj = tmp / "proj"
    proj.mkdir()
    (proj / "mirrored.py").write_text(MIRRORED)
    (proj / "quotes.py").write_text(QUOTES)
    mirror = f"s3://user:{MIRROR_PASSWORD}@{BUCKET}/prefix"
    data = f"s3://user:{DATA_PASSWORD}@{BUCKET}/data"
    specs = {
        "mirrored": _spec(
            "mirrored", ["python", "mirrored.py"],
            f"[checkpoint]\nevery_steps = 2\nmirror = {toml_str(mirror)}\n",
        ),
        # The bare password, in no secret form: only learning it from the spec hides it.
        "quotes": _spec(
            "quotes", ["python", "quotes.py", MIRROR_PASSWORD],
            f"[checkpoint]\nmirror = {toml_str(mirror)}\n",
        ),
        "data": _spec(
            "data", ["python", "quotes.py", DATA_PASSWORD], f"[data]\npath = {toml_str(data)}\n"
        ),
    }  # fmt: skip
    for name, text in specs.items():
        (proj / f"{name}.toml").write_text(text)
    ws = tmp / "ws"
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "AWS_ENDPOINT_URL": s3["endpoint_url"],  # botocore's own variable: the loopback server
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    env.pop("ACCEPTRUN_INJECT", None)
    outputs: list[str] = []
    cli = recording_cli(ws, proj, env, outputs)

    ids: dict[str, str] = {}
    for name in specs:
        before = set(p.name for p in (ws / "runs").iterdir()) if (ws / "runs").is_dir() else set()
        proc = cli("run", "-q", f"{name}.toml")
        assert proc.returncode in (0, 1, 2), f"{name}: {proc.stdout}\n{proc.stderr}"
        (ids[name],) = {p.name for p in (ws / "runs").iterdir()} - before
    for rid in ids.values():
        for args in (
            ("show", rid), ("show", rid, "--json"), ("report", rid),
            ("report", rid, "--format", "md"), ("howto", rid), ("ckpt", "ls", rid),
        ):  # fmt: skip
            proc = cli(*args)
            assert proc.returncode in (0, 1), f"{args}: {proc.stdout}\n{proc.stderr}"
    return {"ws": ws, "ids": ids, "outputs": outputs, "env": env, "proj": proj}


def _marked(data: bytes) -> list[str]:
    return [m for m in (MIRROR_PASSWORD, DATA_PASSWORD) if m.encode() in data]


def test_a_password_in_a_url_field_reaches_no_file_acceptrun_wrote(
    url_runs: dict[str, Any],
) -> None:
    ws, ids = Path(url_runs["ws"]), url_runs["ids"]
    mirrored = ws / "runs" / ids["mirrored"]
    # The mirror was really used: its uploads were tried and are on record.
    assert (mirrored / "mirror.json").is_file()
    kinds = {json.loads(line)["kind"] for line in (mirrored / "events.jsonl").open()}
    assert {"checkpoint_commit", "mirror_failed"} <= kinds, kinds
    steps = [p for p in mirrored.rglob("step-*") if p.is_dir()]
    assert steps, "the mirrored run committed no checkpoint"
    searched, leaks, own_marked = 0, [], set()
    for path in sorted(p for p in ws.rglob("*") if p.is_file()):
        found = _marked(path.read_bytes())
        if path.name in OWN_FILES:
            own_marked |= {path.name} if found else set()
            continue
        if path.suffix in TENSORS:
            continue
        searched += 1
        if found:
            leaks.append(f"{path.relative_to(ws)}: {found}")
    for name in ("events.jsonl", "verdict.json", "ledger.json", "report.html", "run.json"):
        assert all((ws / "runs" / rid / name).is_file() for rid in ids.values()), name
    assert (mirrored / "attempts" / "1" / "exit.json").is_file()
    # The one place the passwords stay is the user's own files, and nowhere else: the frozen
    # spec (what they wrote) and the workload's own stderr (what it printed).
    assert own_marked == {"spec.toml", "stderr.log"}, own_marked
    outputs = url_runs["outputs"]
    leaks += [o.splitlines()[0] for o in outputs if _marked(o.encode())]
    tally("secrets in URL fields (real run)", tried=searched + len(outputs), secrets=len(leaks))
    assert searched > 30
    assert not leaks, f"a URL password found in: {leaks}"


def test_the_workload_hides_the_specs_secrets_in_what_it_writes(url_runs: dict[str, Any]) -> None:
    ws, ids = Path(url_runs["ws"]), url_runs["ids"]
    for name in ("quotes", "data"):
        record = ws / "runs" / ids[name]
        events = [json.loads(line) for line in (record / "events.jsonl").open()]
        ends = [e for e in events if e["kind"] == "workload_end"]
        if name == "data" and not ends:
            continue  # stopped in preflight: no workload ran
        # Written by the workload process itself, which learned the password from the spec.
        assert ends and ends[0]["status"] == "error: RuntimeError: the store refused <redacted>"
        password = MIRROR_PASSWORD if name == "quotes" else DATA_PASSWORD
        assert password in (record / "attempts" / "1" / "stderr.log").read_text()


def _board_paths(ws: Path, ids: dict[str, str]) -> Iterator[tuple[str, str]]:
    """(route, path) for every GET route of the board's routing table, for every run."""
    for route in ROUTES:
        if route.method != "GET":
            continue
        if "{" not in route.path:
            yield route.path, route.path
            continue
        for rid in ids.values():
            path = route.path.replace("{ws}", "0").replace("{run_id}", rid)
            if "{step}" in path:
                steps = sorted(
                    int(m[1]) for p in (ws / "runs" / rid).rglob("step-*")
                    if p.is_dir() and (m := re.fullmatch(r"step-(\d+)", p.name))
                )  # fmt: skip
                for step in steps:
                    yield route.path, path.replace("{step}", str(step))
            else:
                yield route.path, path
    runs = "&".join(f"run=0/{rid}" for rid in ids.values())
    yield "/compare", f"/compare?{runs}"


@contextlib.contextmanager
def ui_board(ws: Path, cwd: Path, env: dict[str, str]) -> Iterator[int]:
    """`acceptrun ui` over ``ws`` on loopback, as a process of its own; yields its port."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "acceptrun", "ui", "--workspace", str(ws),
         "--port", "0", "--token", BOARD_TOKEN],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    killer = threading.Timer(120, proc.kill)  # a board that never says its address fails
    killer.start()
    try:
        assert proc.stdout is not None
        printed = []
        for line in proc.stdout:
            printed.append(line)
            if line.startswith("open http://127.0.0.1:"):
                break
        killer.cancel()
        match = re.match(r"open http://127\.0\.0\.1:(\d+)/", printed[-1] if printed else "")
        assert match, "".join(printed)
        yield int(match[1])
    finally:
        killer.cancel()
        proc.kill()
        proc.wait(timeout=60)


def board_pages(port: int, ws: Path, ids: dict[str, str]) -> Iterator[tuple[str, str, bytes]]:
    """(route, path, body) of every GET route of the board for the runs ``ids``.

    The logs first, on a board that has shown nothing else of these runs yet: they quote
    the workload's output as written, so nothing seen before may teach it.
    """
    paths = sorted(_board_paths(ws, ids), key=lambda rp: "/logs" not in rp[0])
    for route, path in paths:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("GET", path, headers={"Authorization": f"Bearer {BOARD_TOKEN}"})
        resp = conn.getresponse()
        body = resp.read()  # a finished run's feeds end, so this returns
        conn.close()
        assert resp.status in (200, 204), (path, resp.status, body[-2000:])
        yield route, path, body


def test_no_board_page_shows_a_url_password(url_runs: dict[str, Any]) -> None:
    """`acceptrun ui` on loopback, in a shell that holds none of the secrets: every page."""
    env = {k: v for k, v in url_runs["env"].items() if not k.startswith("AWS_")}
    ws = Path(url_runs["ws"])
    with ui_board(ws, url_runs["proj"], env) as port:
        fetched, leaks, routes = 0, [], set()
        for route, path, body in board_pages(port, ws, url_runs["ids"]):
            fetched += 1
            routes.add(route)
            if found := _marked(body):
                leaks.append(f"{path}: {found}")
        tally("board pages", tried=fetched, secrets=len(leaks))
        assert routes == {r.path for r in ROUTES if r.method == "GET"}
        assert not leaks, f"a URL password on the board: {leaks}"
