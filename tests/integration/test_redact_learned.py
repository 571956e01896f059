"""A real failing run: the secret variable a spec names keeps its name in the record and
loses its value, and credentials the workload prints bare are hidden by their shape.

The workload prints ``DB_PASSWORD=<value>`` (the value from the spec's ``[env]``) and
every shape of tests/secret_shapes.py on stderr, then raises an exception quoting them;
the spec names the variable in ``notify.smtp_password_env`` (or has no ``[notify]``).
Searched: every file of the record but the workload's own logs and the user's frozen
spec, and the output of ``show`` and ``show --json`` (not that of ``run``, which echoes
the workload's own output live). The failure is still quoted, with
``DB_PASSWORD=<redacted>`` where the value was.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from campaign import tally
from conftest import Project, toml_str
from secret_shapes import SHAPES, plant_text

VALUE = "hunter2xyz"
SCRIPT = f"""
import os, sys
said = "DB_PASSWORD=" + os.environ["DB_PASSWORD"]
print(said, file=sys.stderr, flush=True)
print({plant_text()!r}, file=sys.stderr, flush=True)
raise RuntimeError("connect failed: " + said + " " + {" | ".join(s.text for s in SHAPES)!r})
"""
# The workload's own output and the spec the user wrote: kept whole, by design.
OWN = {"stdout.log", "stderr.log", "spec.toml"}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _notify() -> str:
    # A mail server nobody listens on, one quick try: the run does not wait on delivery.
    return (
        '[notify]\nemail_to = ["oncall@example.com"]\nemail_from = "run@example.com"\n'
        f'smtp_host = "127.0.0.1"\nsmtp_port = {_closed_port()}\nsmtp_starttls = false\n'
        'smtp_user_env = "SMTP_USER"\nsmtp_password_env = "DB_PASSWORD"\n'
        'retries = 1\ntimeout = "2s"\nclose_wait = "5s"\n'
    )


@pytest.mark.parametrize("notify", [True, False], ids=["with-notify", "without-notify"])
def test_a_named_secret_keeps_its_name_and_shapes_are_hidden(
    project: Project, notify: bool
) -> None:
    extra = f"[env]\nDB_PASSWORD = {toml_str(VALUE)}\n" + (_notify() if notify else "")
    spec = project.spec(SCRIPT, extra=extra)
    run = project.cli("run", str(spec))
    assert run.returncode != 0, run.stdout  # the workload failed
    record = project.only_record()
    shown = (
        project.cli("show", record.run_id).stdout
        + project.cli("show", "--json", record.run_id).stdout
    )
    files = {
        str(p.relative_to(record.path)): p.read_text(errors="replace")
        for p in sorted(record.path.rglob("*"))
        if p.is_file() and p.name not in OWN
    }
    # (not `acceptrun run`'s output: it echoes the workload's own output live, as it is)
    texts = {"acceptrun show": shown, **files}
    needles = [VALUE, "<redacted>=", *(s.needle for s in SHAPES)]
    leaks = [(where, n) for where, text in texts.items() for n in needles if n in text]
    tally(
        "a named secret and shapes in a real run",
        tried=len(texts) * len(needles),
        secrets=len(leaks),
    )
    assert not leaks, leaks
    # the evidence is still there, with the value hidden and the name kept
    verdict = (record.path / "verdict.json").read_text()
    assert "connect failed: DB_PASSWORD=<redacted>" in verdict, verdict
    assert "DB_PASSWORD=<redacted>" in shown
    assert VALUE in (record.path / "attempts" / "1" / "stderr.log").read_text()  # its own


def test_the_record_layout_is_what_this_test_searches(project: Project) -> None:
    # The exemptions above are the workload's logs and the user's spec, by file name: a run
    # writes each where this test expects it.
    spec = project.spec("print('ok')\n")
    project.cli("run", str(spec), check_rc=0)
    names = {p.name for p in project.only_record().path.rglob("*") if p.is_file()}
    assert names >= OWN, names
    assert Path(spec).exists()
