"""Notifications, fast: the condition each recorded event makes, the secret fields read off
the declaration, and the dispatcher's dedupe, retries and records (a loopback server in a
thread; the real runs are in tests/integration/test_notify.py)."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from acceptrun._util import redact
from acceptrun.notify.conditions import SOURCE_KINDS, condition_of
from acceptrun.notify.notifier import Dispatcher
from acceptrun.notify.summary import delivery_lines, delivery_rows
from acceptrun.notify.targets import WebhookTarget, targets_of
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.fields import rules_of
from acceptrun.spec.model import NOTIFY_EVENTS, SECRET_FIELDS, NotifySpec, RunSpec, parse_spec

# One recorded event per source kind, and the words its message must carry.
EVENTS: list[tuple[dict[str, Any], str, str, str]] = [
    ({"kind": "diverged", "step": 7, "loss": "nan", "reason": "loss is nan", "attempt": 1},
     "divergence", "diverged at step 7 (loss nan)", "learning rate"),
    ({"kind": "attempt_exit", "attempt": 2, "outcome": "failed", "class": "cuda_oom",
      "evidence": ["CUDA out of memory"], "decision": "restart"},
     "attempt_failed", "attempt 2 failed: cuda_oom; restart", "batch size"),
    ({"kind": "hang_detected", "attempt": 1, "stall": "hang", "evidence": "stuck in step"},
     "hang", "made no progress", "stacks.txt"),
    ({"kind": "hang_detected", "attempt": 1, "stall": "data_stall"},
     "hang", "waited for data", "data loader"),
    ({"kind": "idle_stop", "attempt": 1, "reason": "GPU idle", "seconds": 900.0},
     "idle_stop", "sat idle", "idle_threshold"),
    ({"kind": "budget_warning", "attempt": 1, "spent_usd": 85.0, "budget_usd": 100.0,
      "fraction": 0.8}, "budget", "spend at 85% of the budget, past 80%", "budget_usd"),
    ({"kind": "budget_warning", "attempt": 1, "spent_usd": 40.0, "budget_usd": 100.0,
      "fraction": 0.8}, "budget", "stop is due before the spend reaches 80% (now 40%)", "budget_usd"),
    ({"kind": "budget_stop", "attempt": 1, "spent_usd": 99.0, "budget_usd": 100.0},
     "budget", "stopping at the budget", "budget_usd"),
    ({"kind": "mirror_behind", "attempt": 1, "status": {"10": "ok", "20": "failed"}},
     "mirror_behind", "mirror is behind", "checkpoint.mirror"),
    ({"kind": "mirror_failed", "attempt": 1, "step": 20, "state": "pending",
      "reason": "ConnectionRefusedError: [Errno 111]", "retry_in_s": 2.0},
     "mirror_behind", "falling behind: step 20 not uploaded, retrying in 2 s", "reachable"),
    ({"kind": "checkpoint_quarantine", "step": 20, "reason": "hash mismatch", "path": "/c"},
     "checkpoint_quarantined", "checkpoint at step 20 failed verification", "verifies"),
    ({"kind": "mirror_quarantine", "step": 20, "reason": "missing file", "url": "s3://b"},
     "checkpoint_quarantined", "mirrored checkpoint at step 20", "verifies"),
]  # fmt: skip


@pytest.mark.parametrize("event,kind,title,fix", EVENTS, ids=[e[0]["kind"] for e in EVENTS])
def test_a_recorded_event_makes_its_message(event: dict[str, Any], kind: str, title: str,
                                            fix: str, tmp_path: Path) -> None:  # fmt: skip
    condition = condition_of({"t": 100.0, **event}, "r1", tmp_path)
    assert condition is not None and condition.kind == kind and condition.t == 100.0
    message = condition.message("job")
    assert message["run"] == "r1" and message["title"].startswith("run r1: ")
    assert title in message["title"] and fix in message["fix"]
    assert message["report"] == str(tmp_path / "report.html")
    assert message["text"].splitlines()[0] == message["title"]


def test_every_source_kind_and_notify_event_is_covered() -> None:
    assert {e[0]["kind"] for e in EVENTS} | {"verdict"} == set(SOURCE_KINDS)
    told = {k for e in EVENTS for k in [e[1]]} | {"accepted", "rejected", "supervisor_gone"}
    assert told == set(NOTIFY_EVENTS)


def test_a_mirror_falling_behind_and_behind_at_the_end_are_two_conditions(tmp_path: Path) -> None:
    live = condition_of({"t": 1.0, "kind": "mirror_failed", "attempt": 1, "step": 20,
                         "state": "pending", "reason": "timeout", "retry_in_s": 4}, "r1", tmp_path)  # fmt: skip
    again = condition_of({"t": 9.0, "kind": "mirror_failed", "attempt": 1, "step": 30,
                          "state": "pending", "reason": "timeout", "retry_in_s": 8}, "r1", tmp_path)  # fmt: skip
    end = condition_of({"t": 20.0, "kind": "mirror_behind", "attempt": 1,
                        "status": {"20": "pending", "30": "pending"}}, "r1", tmp_path)  # fmt: skip
    assert live is not None and again is not None and end is not None
    assert live.key == again.key != end.key  # told once while it lags, once at the end
    assert {live.kind, end.kind} == {"mirror_behind"}


def test_the_verdict_message_carries_the_failed_check_and_its_fix(tmp_path: Path) -> None:
    (tmp_path / "verdict.json").write_text(json.dumps({"checks": [
        {"name": "exit", "status": "fail", "evidence": "attempt 1 diverged", "fix": "lower the lr"},
        {"name": "runtime", "status": "pass", "evidence": "5s", "fix": None},
    ]}))  # fmt: skip
    condition = condition_of({"t": 1.0, "kind": "verdict", "verdict": "rejected"}, "r1", tmp_path)
    assert condition is not None and condition.kind == "rejected"
    assert condition.title == "run r1: rejected (1 failed: exit)"
    assert (condition.evidence, condition.fix) == ("exit: attempt 1 diverged", "lower the lr")


def test_events_that_tell_nothing_make_no_condition(tmp_path: Path) -> None:
    for event in (
        {"t": 1.0, "kind": "attempt_exit", "attempt": 1, "outcome": "success", "class": "success"},
        {"t": 1.0, "kind": "attempt_exit", "attempt": 1, "outcome": "stopped", "class": "stopped"},
        {"t": 1.0, "kind": "heartbeat", "attempt": 1},
        {"kind": "diverged", "step": 1},  # no time: no time to detect
        # a retired step whose remote copy is not deleted yet: nothing a restore needs
        {"t": 1.0, "kind": "mirror_failed", "attempt": 1, "step": 5, "state": "delete_pending"},
    ):
        assert condition_of(event, "r1", tmp_path) is None


def test_the_secret_fields_are_read_off_the_declaration() -> None:
    from acceptrun.spec.fields import fields_of

    declared = {
        (section.name, f.name)
        for section in fields_of(RunSpec).values()
        if dataclasses.is_dataclass(section.default_factory)
        for f in fields_of(section.default_factory).values()  # type: ignore[misc]
        if rules_of(f).secret
    }
    assert set(SECRET_FIELDS) == declared >= {("notify", "webhook"), ("notify", "slack")}


@pytest.mark.parametrize("section,name", SECRET_FIELDS)
def test_a_secret_field_is_hidden_and_left_out_of_the_frozen_spec(section: str, name: str) -> None:
    # A plain URL: no secret form (no userinfo, no signed parameter) gives it away.
    url = f"https://hooks.example.com/services/T0/B0/PLAIN{name.upper()}0x"
    try:
        spec = parse_spec(
            f'name = "t"\ncommand = ["python", "t.py"]\n[{section}]\n{name} = "{url}"\n'
        )
        assert redact.redact_text(f"posting to {url} now") == f"posting to {redact.REDACTED} now"
        frozen = spec.to_toml(secrets=False)
        assert url not in frozen and url in spec.to_toml()
        plain = parse_spec('name = "t"\ncommand = ["python", "t.py"]\n')
        assert plain.hash == spec.hash  # a secret is not part of the spec's hash
        assert parse_spec(frozen).notify == plain.notify
        assert spec.secret_values() == {f"{section}.{name}": url}
    finally:
        redact.forget_learned()


def test_email_needs_its_server_and_sender() -> None:
    with pytest.raises(ValueError, match=r"notify\.email_to"):
        NotifySpec(email_to=["a@example.com"])
    with pytest.raises(ValueError, match=r"notify\.smtp_host"):
        NotifySpec(smtp_host="smtp.example.com")
    with pytest.raises(ValueError, match=r"notify\.smtp_password_env"):
        NotifySpec(email_to=["a@example.com"], smtp_host="h", email_from="b@example.com",
                   smtp_password_env="P")  # fmt: skip


class _Receiver:
    def __init__(self, fail_first: int) -> None:
        self.bodies: list[Any] = []
        self.fails = fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.fails > 0:
                    outer.fails -= 1
                    self.send_response(503)
                else:
                    outer.bodies.append(json.loads(body))
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/s3cr3tpath"


@pytest.fixture
def receiver(request: pytest.FixtureRequest) -> Iterator[_Receiver]:
    r = _Receiver(getattr(request, "param", 0))
    yield r
    r.server.shutdown()
    r.server.server_close()


def _record(tmp_path: Path) -> RunRecord:
    path = tmp_path / "runs" / "r1"
    path.mkdir(parents=True)
    return RunRecord(path)


@pytest.mark.parametrize("receiver", [2], indirect=True)
def test_a_repeat_is_sent_once_after_retries_and_recorded(receiver: _Receiver,
                                                          tmp_path: Path) -> None:  # fmt: skip
    record = _record(tmp_path)
    notify = NotifySpec(webhook=receiver.url, retries=3, retry_backoff=0.01)  # type: ignore[arg-type]
    dispatcher = Dispatcher(record, notify, name="t")
    condition = condition_of({"t": 1.0, "kind": "diverged", "step": 3, "loss": "nan",
                              "reason": "nan", "attempt": 1}, "r1", record.path)  # fmt: skip
    assert condition is not None
    dispatcher.submit(condition)
    dispatcher.submit(condition)  # the same condition again: deduped
    dispatcher.close(60.0)
    assert len(receiver.bodies) == 1
    (ev,) = list(record.events("notify"))
    assert (ev["outcome"], ev["attempts"], ev["event"]) == ("delivered", 3, "divergence")
    assert ev["time_to_detect_s"] == pytest.approx(ev["delivered_at"] - 1.0, abs=2e-3)
    # A dispatcher started later (a resume) reads the delivery back and sends nothing.
    later = Dispatcher(record, notify, name="t")
    later.submit(condition)
    later.close(60.0)
    assert len(receiver.bodies) == 1
    (line,) = delivery_lines(delivery_rows(record.events("notify")))
    assert line.startswith("notify   divergence -> webhook http://127.0.0.1:")
    assert "s3cr3tpath" not in record.events_path.read_text()


@pytest.mark.parametrize("receiver", [100], indirect=True)
def test_a_target_that_never_answers_is_recorded_as_failed(
    receiver: _Receiver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    record = _record(tmp_path)
    notify = NotifySpec(webhook=receiver.url, retries=2, retry_backoff=0.01)  # type: ignore[arg-type]
    dispatcher = Dispatcher(record, notify)
    condition = condition_of({"t": 1.0, "kind": "idle_stop", "reason": "idle"}, "r1", record.path)
    assert condition is not None
    dispatcher.submit(condition)
    dispatcher.close(60.0)
    (ev,) = list(record.events("notify"))
    assert (ev["outcome"], ev["attempts"], ev["error"]) == (
        "failed",
        2,
        "HTTP 503 Service Unavailable",
    )
    assert "was not delivered" in caplog.text
    assert "NOT DELIVERED: failed" in delivery_lines(delivery_rows([ev]))[0]


def test_watch_once_on_a_workspace_and_a_bad_period(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from acceptrun.cli.main import main

    ws = tmp_path / ".acceptrun"
    (ws / "runs").mkdir(parents=True)
    assert main(["--workspace", str(ws), "watch", "--once"]) == 0
    assert "0 gone supervisor(s) found" in capsys.readouterr().err
    assert main(["--workspace", str(ws), "watch", "--every", "0s"]) == 2
    assert "--every '0s' is not a positive duration" in capsys.readouterr().err


def test_the_smtp_password_is_hidden_from_the_first_message_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Learned when the e-mail target is made (its variable's name looks like no secret),
    not at its first login: a webhook's message quoting it (a failure that printed it) is
    redacted before any mail was sent."""
    password = "plain-pw-without-shape-8812"
    monkeypatch.setenv("NT_MAIL_WORD", password)
    notify = NotifySpec(
        webhook="http://127.0.0.1:9/hook", email_to=["a@example.com"], smtp_host="h",
        email_from="b@example.com", smtp_user_env="NT_USER", smtp_password_env="NT_MAIL_WORD",
    )  # fmt: skip
    try:
        webhook = next(t for t in targets_of(notify) if isinstance(t, WebhookTarget))
        message = {"text": f"failed: {password}", "evidence": f'{{"password": "{password}"}}'}
        body = webhook.body(message)
        assert password.encode() not in body
        assert json.loads(body)["text"] == "failed: <redacted>"
    finally:
        redact.forget_learned()


def test_every_failure_class_has_its_fix_in_a_message() -> None:
    """A class added tomorrow (setup_changed was) gets its own fix, not the generic one."""
    from acceptrun.notify.conditions import _CLASS_FIX, _NOT_FAILED
    from acceptrun.record.status import FailureClass

    missing = {c.value for c in FailureClass} - set(_CLASS_FIX) - set(_NOT_FAILED)
    assert missing == set(), f"no fix for {sorted(missing)} in notify/conditions.py _CLASS_FIX"
