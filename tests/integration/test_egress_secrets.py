"""Every credential shape a hostile workload holds reaches no exit of acceptrun.

Planted, in one real run that fails: every ``SHAPES[i].text`` (tests/secret_shapes.py)
printed on stdout and on stderr, in the message of the exception that ends the workload,
in its arguments, and in its environment under names that look secret (``HF_TOKEN``) and
names that do not (``MY_VAR``, ``PLANTED_<i>``); a learned secret (``[notify]
smtp_password_env = "DB_PASSWORD"``, set in ``[env]``, printed as ``DB_PASSWORD=<value>``).
The spec's ``[notify]`` points at real receivers on 127.0.0.1: a JSON webhook, a
Slack-style webhook, an SMTP server (STARTTLS and a login with that password) and a
command that writes its argv, environment and stdin to a file.

Then every reading command runs (``show``, ``show --json``, ``report`` in html, md and
json, ``logs``, ``cost show``, ``howto``, ``bundle`` with the logs, then extracted), every
``export`` target of the parser, and ``acceptrun ui`` serves every GET route of its routing
table for the run. Searched for every needle: every file under the workspace and the
user's configuration but the files kept whole on purpose (listed by the registry,
:data:`acceptrun._util.egress.KEPT_WHOLE`), every command's output, every bundle member,
every export, every page, and every message each receiver got (raw and decoded).
"""

from __future__ import annotations

import argparse
import email
import email.policy
import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
from notify_receivers import SmtpReceiver, WebhookReceiver
from test_secrets import board_pages, ui_board
from tests.campaign import tally

from acceptrun._util.egress import KEPT_WHOLE
from acceptrun._util.redact import REDACTED
from acceptrun.cli.main import build_parser
from acceptrun.ui.server import ROUTES
from conftest import toml_str, wait_for
from secret_shapes import SHAPES

pytestmark = pytest.mark.slow

DB_PASSWORD = "plain-Learned-pw-7413"  # no shape, no form: only learning it hides it
SMTP_USER = "runner"
GITHUB = next(s for s in SHAPES if s.family == "github classic").needle
HUGGINGFACE = next(s for s in SHAPES if s.family == "huggingface").needle

HOSTILE = """
import os, sys
import acceptrun

TEXTS = {texts!r}

class Counter:
    def state_dict(self): return {{"n": 1}}
    def load_state_dict(self, state): pass

run = acceptrun.init()
run.restore(counter=Counter())
for step in run.steps(0, 3):
    run.log(step, loss=1.0 / (step + 1))
    if step == 1:
        run.checkpoint(step, block=True)  # a store with a checkpoint, served by the board
for text in TEXTS:
    print("stdout:", text, flush=True)
    print("stderr:", text, file=sys.stderr, flush=True)
print("DB_PASSWORD=" + os.environ["DB_PASSWORD"], file=sys.stderr, flush=True)
print("argv", sys.argv[1:], "MY_VAR", os.environ["MY_VAR"], file=sys.stderr, flush=True)
raise RuntimeError(
    "refused by the hub: DB_PASSWORD=" + os.environ["DB_PASSWORD"] + " " + " | ".join(TEXTS)
)
"""

TOLD = """
import json, os, sys
with open({out!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv, "env": dict(os.environ), "stdin": sys.stdin.read()}}) + "\\n")
"""


def _spec(proj: Path, hook: WebhookReceiver, slack: WebhookReceiver, smtp: SmtpReceiver) -> Path:
    texts = [s.text for s in SHAPES]
    (proj / "hostile.py").write_text(HOSTILE.format(texts=texts))
    (proj / "told.py").write_text(TOLD.format(out=str(proj / "told.jsonl")))
    command = [sys.executable, "hostile.py", *texts]
    env = {"HF_TOKEN": HUGGINGFACE, "MY_VAR": GITHUB, "DB_PASSWORD": DB_PASSWORD}
    env |= {f"PLANTED_{i}": s.text for i, s in enumerate(SHAPES)}
    spec = proj / "spec.toml"
    spec.write_text(
        textwrap.dedent(f"""
        name = "hostile"
        command = {json.dumps(command)}
        [limits]
        max_restarts = 0
        [notify]
        webhook = {toml_str(hook.url)}
        slack = {toml_str(slack.url)}
        email_to = ["oncall@example.com"]
        email_from = "acceptrun@example.com"
        smtp_host = "127.0.0.1"
        smtp_port = {smtp.port}
        smtp_user_env = "SMTP_USER"
        smtp_password_env = "DB_PASSWORD"
        command = [{toml_str(sys.executable)}, {toml_str(str(proj / "told.py"))}]
        [env]
        """)
        + "".join(f"{k} = {toml_str(v)}\n" for k, v in env.items())
    )
    return spec


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _export_args(spec: Path, tmp: Path) -> list[tuple[str, ...]]:
    """One command line per ``export`` target of the parser, from its positional arguments."""
    needs = {  # the options a target requires, and where it writes
        "kubernetes": ("--image", "registry.example.com/train:1"),
        "mlflow": ("--tracking-uri", f"sqlite:///{tmp / 'mlflow.db'}"),
        "wheel": ("-o", str(tmp / "wheel")),
    }
    out = []
    for name, target in _subcommands(_subcommands(build_parser())["export"]).items():
        args = ["export", name]
        args += [{"spec": str(spec), "run": "latest"}[a.dest] for a in target._actions
                 if not a.option_strings]  # fmt: skip
        out.append((*args, *needs.get(name, ())))
    return out


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("egress")
    proj = tmp / "proj"
    proj.mkdir()
    ws = tmp / "ws"
    outputs: dict[str, str] = {}
    with (
        WebhookReceiver() as hook,
        WebhookReceiver() as slack,
        SmtpReceiver(tmp, user=SMTP_USER, password=DB_PASSWORD) as smtp,
    ):
        spec = _spec(proj, hook, slack, smtp)
        bin_dir = str(Path(sys.executable).parent)
        env = {
            **os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "SSL_CERT_FILE": str(smtp.cert), "SMTP_USER": SMTP_USER, "DB_PASSWORD": DB_PASSWORD,
        }  # fmt: skip

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            proc = subprocess.run(
                [sys.executable, "-m", "acceptrun", "--workspace", str(ws), *args],
                cwd=proj, env=env, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            outputs[" ".join(args)] = proc.stdout + proc.stderr
            return proc

        # Without -q: the workload's live echo is searched with the rest of run's output.
        run = cli("run", "spec.toml")
        assert run.returncode == 1, run.stdout + run.stderr  # rejected: the workload failed
        assert f"stdout: token {REDACTED}" in run.stdout, run.stdout  # the echo, redacted
        commands = [
            ("ls",), ("show", "latest"), ("show", "latest", "--json"), ("report", "latest"),
            ("report", "latest", "--format", "md"), ("report", "latest", "--format", "json"),
            ("logs", "latest"), ("logs", "latest", "--stderr-only"), ("cost", "show", "latest"),
            ("howto", "latest"),
            ("bundle", "latest", "--include-logs", "-o", str(tmp / "bundle.tar.gz")),
            *_export_args(spec, tmp),
        ]  # fmt: skip
        for args in commands:
            proc = cli(*args)
            assert proc.returncode in (0, 1), f"{args}: {proc.stdout}\n{proc.stderr}"
        messages = {
            "webhook": hook.raw, "slack": slack.raw, "email (raw)": smtp.raw,
            "email (decoded)": [_decoded(m) for _, m in smtp.messages],
            "command": [line.encode() for line in (proj / "told.jsonl").read_text().splitlines()],
        }  # fmt: skip
    (run_id,) = [p.name for p in (ws / "runs").iterdir()]
    members = tmp / "bundle"
    with tarfile.open(tmp / "bundle.tar.gz") as tar:
        tar.extractall(members, filter="data")
    return {
        "tmp": tmp, "ws": ws, "proj": proj, "env": env, "run_id": run_id, "outputs": outputs,
        "messages": messages, "members": members, "hook": hook, "slack": slack,
    }  # fmt: skip


def _decoded(mail: email.message.EmailMessage) -> bytes:
    """An e-mail as a reader sees it: every header decoded, the body's text."""
    headers = "\n".join(f"{k}: {v}" for k, v in mail.items())
    return (headers + "\n\n" + mail.get_content()).encode()


def _needles(run: dict[str, Any]) -> list[str]:
    # The webhook URLs' paths are credentials as well (a Slack hook's path is its key).
    return [s.needle for s in SHAPES] + [
        DB_PASSWORD,
        run["hook"].secret_path,
        run["slack"].secret_path,
    ]


def _kept_whole(path: Path, ws: Path) -> bool:
    rel = path.relative_to(ws).as_posix() if ws in path.parents else ""
    return any(fnmatch(rel, kept.pattern) for kept in KEPT_WHOLE)


def _places(run: dict[str, Any]) -> dict[str, bytes]:
    """Every place searched, by name: files, outputs, bundle members, messages."""
    ws, tmp = run["ws"], run["tmp"]
    places: dict[str, bytes] = {}
    roots = [ws, run["members"], Path(os.environ["ACCEPTRUN_CONFIG_DIR"]), tmp / "wheel"]
    roots += [p for p in tmp.iterdir() if p.name.startswith("mlflow") or p.name == "mlruns"]
    roots += [run["proj"] / "mlruns"]
    for root in roots:
        files = [root] if root.is_file() else sorted(root.rglob("*")) if root.is_dir() else []
        for path in files:
            if path.is_file() and not path.is_symlink() and not _kept_whole(path, ws):
                places[str(path.relative_to(tmp) if tmp in path.parents else path)] = (
                    path.read_bytes()
                )
    for args, text in run["outputs"].items():
        places[f"$ acceptrun {args}"] = text.encode()
    for target, bodies in run["messages"].items():
        for i, body in enumerate(bodies):
            places[f"{target} message {i + 1}"] = body
    return places


def test_no_secret_reaches_any_exit(hostile: dict[str, Any]) -> None:
    places = _places(hostile)
    with ui_board(hostile["ws"], hostile["proj"], hostile["env"]) as port:
        routes = set()
        for route, path, body in board_pages(port, hostile["ws"], {"run": hostile["run_id"]}):
            routes.add(route)
            places[f"board {path}"] = body
    assert routes == {r.path for r in ROUTES if r.method == "GET"}
    needles = _needles(hostile)
    leaks = [
        f"{name}: {needle[:12]}…"
        for name, data in places.items()
        for needle in needles
        if needle.encode() in data
    ]
    tally("secrets at every exit", tried=len(places) * len(needles), secrets=len(leaks))
    # Every kind of exit was searched: files, bundle members, outputs, pages, each receiver.
    assert any(name.startswith("bundle/") for name in places), sorted(places)[:20]
    assert {m.split(" message")[0] for m in places if " message " in m} == set(hostile["messages"])
    assert len(places) > 60, len(places)
    assert not leaks, "secrets found:\n" + "\n".join(leaks)


def test_the_evidence_is_still_quoted_with_the_secrets_redacted(hostile: dict[str, Any]) -> None:
    ws, run_id = hostile["ws"], hostile["run_id"]
    record = ws / "runs" / run_id
    # The workload's own log keeps what it printed (kept whole, by the registry)...
    stderr = (record / "attempts" / "1" / "stderr.log").read_text()
    assert all(s.needle in stderr for s in SHAPES) and DB_PASSWORD in stderr
    # ...while the verdict and every message name the failure, with <redacted> in its place.
    verdict = (record / "verdict.json").read_text()
    assert "refused by the hub" in verdict and REDACTED in verdict
    for target in ("webhook", "slack", "email (decoded)", "command"):
        bodies = [b.decode(errors="replace") for b in hostile["messages"][target]]
        assert bodies, f"the {target} receiver got no message"
        told = [b for b in bodies if "refused by the hub" in b]
        assert told and all(REDACTED in b for b in told), (target, bodies[:1])


# ---- a detached child's log: redacted by a pump that outlives whoever started it ----------

STARTER = """
import subprocess, sys
from pathlib import Path
from acceptrun._util import logpump

pump = logpump.start(Path(sys.argv[1]))
subprocess.Popen([sys.executable, "-c", sys.argv[2]], stdout=pump.stdin,
                 stderr=subprocess.STDOUT, start_new_session=True)
pump.stdin.close()
"""
# Blocks on the FIFO until the test opens it, after the starter is gone; then prints.
CHILD = """
import sys
open(sys.argv[1] if len(sys.argv) > 1 else {fifo!r}).read()
for text in {texts!r}:
    print("job:", text, flush=True)
print('{{"password": "{password}"}}', flush=True)
print("done", flush=True)
"""


def test_a_detached_childs_log_is_redacted_after_its_starter_is_gone(tmp_path: Path) -> None:
    """The way a queued job and a board's resume log: the starter exits first."""
    fifo, log = tmp_path / "go", tmp_path / "job.log"
    os.mkfifo(fifo)
    child = CHILD.format(fifo=str(fifo), texts=[s.text for s in SHAPES], password=DB_PASSWORD)
    starter = subprocess.run(
        [sys.executable, "-c", STARTER, str(log), child], capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert starter.returncode == 0, starter.stderr
    with open(fifo, "w"):  # the child goes on: its starter has exited
        pass
    text = wait_for(
        lambda: log.exists() and "done" in (t := log.read_text()) and t, timeout=120,
        what="the child's last line in its log",
    )  # fmt: skip
    leaks = [s.family for s in SHAPES if s.needle in text] + [DB_PASSWORD] * (DB_PASSWORD in text)
    tally("secrets in a detached child's log", tried=len(SHAPES) + 1, secrets=len(leaks))
    assert not leaks, leaks
    assert text.count("job: ") == len(SHAPES) and '{"password": "<redacted>"}' in text


# ---- a hung workload's stack dump ---------------------------------------------------------

HANGS_IN = """
import time
import acceptrun

def {name}():
    time.sleep(1000)  # stuck in a step, in a function named like a token

run = acceptrun.init()
for step in run.steps(0, 5):
    run.log(step, loss=1.0)
    if step == 2:
        {name}()
"""


def test_a_hung_workloads_stack_dump_is_redacted(tmp_path: Path) -> None:
    """faulthandler writes stacks.txt from C, raw; the supervisor redacts it once collected."""
    (tmp_path / "train.py").write_text(HANGS_IN.format(name=GITHUB))  # ghp_...: an identifier
    (tmp_path / "spec.toml").write_text(
        f'name = "hung"\ncommand = [{toml_str(sys.executable)}, "train.py"]\n'
        '[env]\nACCEPTRUN_HEARTBEAT_S = "0.2"\n[limits]\nhang_window = "5s"\nmax_restarts = 0\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "acceptrun", "--workspace", str(tmp_path / "ws"), "run", "-q",
         "spec.toml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    (record,) = (tmp_path / "ws" / "runs").iterdir()
    stacks = (record / "attempts" / "1" / "stacks.txt").read_text()
    tally("secrets in a stack dump", tried=1, secrets=int(GITHUB in stacks))
    assert GITHUB not in stacks, stacks
    assert re.search(r'train\.py", line \d+ in <redacted>', stacks), stacks  # still the frame
