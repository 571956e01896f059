"""Notifications against real receivers on loopback, driven by real `acceptrun run`s.

Each test starts a receiver (an HTTP server that keeps every body, one that answers 500
first; a real SMTP server with STARTTLS and a login), runs a small script that diverges,
hangs, crosses budget shares, loses its supervisor or ends accepted, and checks each
delivery: its content (the run, the failure in words, the fix, the report), its
``notify`` event (tries, outcome, time to detect from the condition's own time), and that
the webhook URL's secret part and the SMTP password are in no file of the workspace (but
the 0600 secrets file kept beside the runs) nor in the command's output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from notify_receivers import (
    CORRUPTS,
    MIRROR_LAGS,
    SmtpReceiver,
    WebhookReceiver,
    watchdog_of,
)

from acceptrun.record.workspace import RunRecord
from budget_job import make
from conftest import only_record_in, wait_for

PYTHON = sys.executable
DEADLINE_S = 300.0  # a generous bound: only a broken delivery comes near it

DIVERGES = """
import acceptrun
run = acceptrun.init()
for step in run.steps(0, 50):
    run.log(step, loss=float("nan") if step == 5 else 1.0 / (1 + step))
"""

ACCEPTED = """
import acceptrun
run = acceptrun.init()
for step in run.steps(0, 5):
    run.log(step, loss=1.0 / (1 + step))
"""

HANGS = "import signal\nprint('started', flush=True)\nsignal.pause()\n"

SINK = """
import json, os, sys
body = json.load(sys.stdin)
env = {k: v for k, v in os.environ.items() if k.startswith("ACCEPTRUN_NOTIFY_")}
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"body": body, "env": env}) + "\\n")
if len(sys.argv) > 2:  # a FIFO the workload waits on: told, it may go on
    with open(sys.argv[2], "w"):
        pass
"""


def _cli(*args: str, cwd: Path, timeout: float = DEADLINE_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", *args], cwd=cwd, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def _job(tmp_path: Path, script: str, extra: str) -> tuple[Path, Path]:
    job = tmp_path / "job"
    job.mkdir(exist_ok=True)
    (job / "train.py").write_text(textwrap.dedent(script))
    spec = job / "spec.toml"
    spec.write_text(f'name = "nt"\ncommand = ["{PYTHON}", "train.py"]\n{textwrap.dedent(extra)}')
    return spec, tmp_path / "ws" / ".acceptrun"


def _events(record: RunRecord, kind: str) -> list[dict[str, Any]]:
    return list(record.events(kind))


def _leaks(ws: Path, secrets: list[str], *outputs: str) -> list[str]:
    """Files of the workspace (but the secrets file) and outputs that hold a secret."""
    found = []
    for path in ws.rglob("*"):
        if not path.is_file() or path.parent.name == "secrets":
            continue
        data = path.read_bytes()
        found += [f"{path.relative_to(ws)}" for s in secrets if s.encode() in data]
    found += [f"output {i}" for i, text in enumerate(outputs) for s in secrets if s in text]
    return found


def _check_delivered(ev: dict[str, Any], source: dict[str, Any] | None, started: float) -> None:
    """A delivered notify event: tries, its condition's own time, time to detect."""
    assert ev["outcome"] == "delivered", ev
    assert ev["attempts"] >= 1
    if source is not None:
        assert ev["condition_t"] == pytest.approx(source["t"], abs=1e-6)
    ttd = ev["time_to_detect_s"]
    assert ttd == pytest.approx(ev["delivered_at"] - ev["condition_t"], abs=2e-3)
    assert 0 <= ttd < time.time() - started + 1  # non-negative, within the test's own time


def test_a_divergence_is_told_after_a_failed_try_and_the_url_stays_secret(tmp_path: Path) -> None:
    started = time.time()
    with WebhookReceiver(fail_first=1) as hook, WebhookReceiver() as slack:
        spec, ws = _job(tmp_path, DIVERGES, f"""
            [limits]
            max_restarts = 0
            [notify]
            webhook = "{hook.url}"
            slack = "{slack.url}"
            slack_events = ["divergence"]
            retry_backoff = "0.2s"
            """)  # fmt: skip
        done = _cli("--workspace", str(ws), "run", str(spec), cwd=spec.parent)
        assert done.returncode == 1, done.stderr
        record = only_record_in(ws)
        (diverged,) = _events(record, "diverged")
        bodies = {b["event"]: b for b in hook.bodies()}
        assert set(bodies) == {"divergence", "attempt_failed", "rejected"}, bodies
        assert hook.failed == 1  # the first try got a 500, the second went through
        body = bodies["divergence"]
        assert body["run"] == record.run_id and body["name"] == "nt"
        assert "diverged at step 5 (loss nan)" in body["title"]
        assert "learning rate" in body["fix"]
        assert body["report"] == str(record.path / "report.html")
        assert body["condition_t"] == pytest.approx(diverged["t"])
        assert body["text"].startswith(f"run {record.run_id}: diverged")
        assert "attempt 1 failed: diverged" in bodies["attempt_failed"]["title"]
        assert bodies["rejected"]["title"].endswith("rejected (1 failed: exit)")
        assert bodies["rejected"]["fix"]  # the verdict's own fix
        # Slack gets {"text": ...} only, and only the events it asked for.
        ((_, _, only),) = slack.received
        assert set(only) == {"text"} and "diverged at step 5" in only["text"]
        delivered = _events(record, "notify")
        by_target = {(e["event"], e["target"].split()[0]): e for e in delivered}
        assert len(by_target) == 4 == len(delivered)  # each condition once per target
        first = by_target[("divergence", "webhook")]
        assert first["attempts"] == 2  # 500, then delivered
        _check_delivered(first, diverged, started)
        for ev in delivered:
            _check_delivered(ev, None, started)
            assert ev["target"].endswith("/…")  # the host alone, never the URL's path
        # The report and `show` list the deliveries with their time to detect.
        assert "Notifications" in (record.path / "report.html").read_text()
        shown = _cli("--workspace", str(ws), "show", record.run_id, cwd=tmp_path)
        assert "notify   divergence -> webhook" in shown.stdout and "time to detect" in shown.stdout
        secret = [hook.secret_path, slack.secret_path]
        assert not _leaks(ws, secret, done.stdout, done.stderr, shown.stdout, shown.stderr)
        # The URLs are kept beside the runs, for a resume and `acceptrun watch`: mode 0600.
        kept = ws / "secrets" / f"{record.run_id}.json"
        assert kept.stat().st_mode & 0o777 == 0o600
        assert json.loads(kept.read_text())["notify.webhook"] == hook.url


def test_a_failing_target_is_recorded_loudly(tmp_path: Path) -> None:
    with WebhookReceiver(fail_first=1000) as hook:
        spec, ws = _job(tmp_path, ACCEPTED, f"""
            [notify]
            webhook = "{hook.url}"
            events = ["accepted"]
            retries = 3
            retry_backoff = "0.1s"
            """)  # fmt: skip
        done = _cli("--workspace", str(ws), "run", str(spec), cwd=spec.parent)
        assert done.returncode == 0, done.stderr
        record = only_record_in(ws)
        (ev,) = _events(record, "notify")
        assert (ev["outcome"], ev["attempts"], ev["error"]) == (
            "failed",
            3,
            "HTTP 500 Internal Server Error",
        )
        assert "delivered_at" not in ev
        assert "notify: accepted of run" in done.stderr and "was not delivered" in done.stderr
        assert hook.failed == 3 and not hook.received
        assert not _leaks(ws, [hook.secret_path], done.stdout, done.stderr)


def test_an_accepted_run_is_told_to_a_command_and_a_webhook(tmp_path: Path) -> None:
    started = time.time()
    out = tmp_path / "sink.jsonl"
    (tmp_path / "sink.py").write_text(textwrap.dedent(SINK))
    with WebhookReceiver() as hook:
        spec, ws = _job(tmp_path, ACCEPTED, f"""
            [notify]
            webhook = "{hook.url}"
            command = ["{PYTHON}", "{tmp_path / 'sink.py'}", "{out}"]
            command_events = ["accepted", "rejected"]
            """)  # fmt: skip
        done = _cli("--workspace", str(ws), "run", str(spec), cwd=spec.parent)
        assert done.returncode == 0, done.stderr
        record = only_record_in(ws)
        (verdict,) = _events(record, "verdict")
        (body,) = hook.bodies()
        assert body["event"] == "accepted" and body["title"] == f"run {record.run_id}: accepted"
        (line,) = out.read_text().splitlines()
        told = json.loads(line)
        assert told["body"]["event"] == "accepted" and told["body"]["run"] == record.run_id
        assert told["env"]["ACCEPTRUN_NOTIFY_EVENT"] == "accepted"
        assert told["env"]["ACCEPTRUN_NOTIFY_REPORT"] == str(record.path / "report.html")
        delivered = _events(record, "notify")
        assert {e["target"].split()[0] for e in delivered} == {"webhook", "command"}
        for ev in delivered:
            _check_delivered(ev, verdict, started)
        assert not _leaks(ws, [hook.secret_path], done.stdout, done.stderr)


def test_a_hang_is_told_by_email_over_starttls(tmp_path: Path) -> None:
    started = time.time()
    with SmtpReceiver(tmp_path) as smtp:
        os.environ["SSL_CERT_FILE"] = str(smtp.cert)  # the server's self-signed certificate
        os.environ["NT_SMTP_USER"] = smtp.user
        os.environ["NT_SMTP_PASSWORD"] = smtp.password
        spec, ws = _job(tmp_path, HANGS, f"""
            [limits]
            hang_window = "5s"
            max_restarts = 0
            [notify]
            email_to = ["oncall@example.com"]
            email_from = "acceptrun@example.com"
            smtp_host = "127.0.0.1"
            smtp_port = {smtp.port}
            smtp_user_env = "NT_SMTP_USER"
            smtp_password_env = "NT_SMTP_PASSWORD"
            email_events = ["hang", "rejected"]
            """)  # fmt: skip
        done = _cli("--workspace", str(ws), "run", str(spec), cwd=spec.parent)
        assert done.returncode == 1, done.stderr
        record = only_record_in(ws)
        (hang,) = _events(record, "hang_detected")
        mails = {m["Subject"]: m for _, m in smtp.messages}
        assert len(mails) == 2, list(mails)
        subject = next(s for s in mails if "hang window" in s)
        assert subject.startswith(f"[acceptrun] run {record.run_id}: attempt 1 made no progress")
        text = mails[subject].get_content()
        assert "stacks.txt" in text and str(record.path / "report.html") in text
        assert mails[subject]["To"] == "oncall@example.com"
        delivered = _events(record, "notify")
        assert {e["event"] for e in delivered} == {"hang", "rejected"}
        (told,) = [e for e in delivered if e["event"] == "hang"]
        assert told["target"] == f"email 127.0.0.1:{smtp.port}"
        _check_delivered(told, hang, started)
        assert not _leaks(ws, [smtp.password], done.stdout, done.stderr)


def test_each_budget_share_crossed_is_told_once(tmp_path: Path) -> None:
    started = time.time()
    with WebhookReceiver() as hook:
        spec, ws = make(tmp_path, 'budget_usd = 8.0\ngrace_period = "2s"\nmax_restarts = 0')
        spec.write_text(spec.read_text() + textwrap.dedent(f"""
            [notify]
            webhook = "{hook.url}"
            events = ["budget"]
            budget_fractions = [0.25, 0.5]
            """))  # fmt: skip
        done = _cli("--workspace", str(ws), "run", str(spec), cwd=spec.parent)
        assert done.returncode == 1, done.stderr
        record = only_record_in(ws)
        warnings = {w["fraction"]: w for w in _events(record, "budget_warning")}
        assert set(warnings) == {0.25, 0.5}
        keys = sorted(b["title"] for b in hook.bodies())
        assert len(keys) == 3, keys  # 25 %, 50 % and the stop
        assert any("stopping at the budget" in k for k in keys)
        for ev in _events(record, "notify"):
            source = (
                warnings.get(float(ev["key"].split(":")[1])) if "stop" not in ev["key"] else None
            )
            _check_delivered(ev, source, started)
        assert not _leaks(ws, [hook.secret_path], done.stdout, done.stderr)


# Waits on attempt 1 (its supervisor is killed), ends at once on attempt 2 (the resume).
PAUSES_ONCE = (
    "import os, signal\nprint('started', flush=True)\n"
    "if os.environ['ACCEPTRUN_ATTEMPT'] == '1':\n    signal.pause()\n"
)


def test_a_gone_supervisor_is_told_by_watch_once_and_the_resume_tells_its_own(
    tmp_path: Path,
) -> None:
    started = time.time()
    with WebhookReceiver() as hook:
        spec, ws = _job(tmp_path, PAUSES_ONCE, f"""
            [limits]
            grace_period = "1s"
            [notify]
            webhook = "{hook.url}"
            """)  # fmt: skip
        ws.mkdir(parents=True)
        watch = subprocess.Popen(
            [PYTHON, "-m", "acceptrun", "--workspace", str(ws), "watch", "--every", "0.2s"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        sup = subprocess.Popen(
            [PYTHON, "-m", "acceptrun", "--workspace", str(ws), "run", str(spec)],
            cwd=spec.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            record = wait_for(
                lambda: (ws / "runs").is_dir() and any((ws / "runs").glob("[!.]*/run.json"))
                and only_record_in(ws), DEADLINE_S, what="the run record",
            )  # fmt: skip
            wait_for(lambda: _events(record, "attempt_start"), DEADLINE_S, what="attempt 1")
            # Once its watchdog runs, which ends the workload after the death (no orphan).
            wait_for(lambda: watchdog_of(sup.pid), DEADLINE_S, what="the watchdog")
            sup.send_signal(signal.SIGKILL)
            sup.wait(timeout=60)
            (body,) = wait_for(
                lambda: hook.bodies("supervisor_gone"), DEADLINE_S, what="the message"
            )
        finally:
            for proc in (sup, watch):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT if proc is watch else signal.SIGKILL)
            watch_out, watch_err = watch.communicate(timeout=120)
            sup_out, sup_err = sup.communicate(timeout=60)
        assert body["run"] == record.run_id
        assert "its supervisor is gone" in body["title"]
        assert (
            body["fix"]
            == f"acceptrun resume {record.run_id} continues it from the newest checkpoint"
        )
        (ev,) = [e for e in _events(record, "notify") if e["event"] == "supervisor_gone"]
        assert ev["by"] == "watch" and ev["condition"] == "lease"
        lease = json.loads((record.path / "supervisor.json").read_text())
        assert ev["condition_t"] == pytest.approx(lease["renewed_at"], abs=1e-6)
        _check_delivered(ev, None, started)
        # A second watcher (say after a restart) reads the delivery back: nothing sent again.
        again = _cli("--workspace", str(ws), "watch", "--once", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert len(hook.bodies("supervisor_gone")) == 1
        # The resume reads the URL back from the secrets file and tells its own conditions
        # (its verdict), none of the run's before it again.
        resumed = _cli("--workspace", str(ws), "resume", record.run_id, "--from-scratch",
                       cwd=tmp_path)  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        (accepted,) = hook.bodies("accepted")
        assert accepted["run"] == record.run_id
        assert len(hook.bodies("supervisor_gone")) == 1
        assert {b["event"] for b in hook.bodies()} <= {
            "supervisor_gone",
            "attempt_failed",
            "accepted",
        }
        outputs = (watch_out, watch_err, sup_out, sup_err, again.stdout, again.stderr,
                   resumed.stdout, resumed.stderr)  # fmt: skip
        assert not _leaks(ws, [hook.secret_path], *outputs)


IDLES = """
import time, acceptrun
run = acceptrun.init()
for step in run.steps(0, 100):
    run.log(step, loss=1.0)
    if step >= 3:
        while not run.stop_requested:
            time.sleep(0.05)
"""


def test_an_idle_stop_is_told(tmp_path: Path) -> None:
    started = time.time()
    with WebhookReceiver() as hook:
        spec, ws = _job(tmp_path, IDLES, f"""
            [limits]
            idle_window = "3s"
            [telemetry]
            interval = "0.5s"
            [notify]
            webhook = "{hook.url}"
            events = ["idle_stop"]
            """)  # fmt: skip
        done = _cli("--workspace", str(ws), "run", str(spec), cwd=spec.parent)
        record = only_record_in(ws)
        (stop,) = _events(record, "idle_stop")
        (body,) = hook.bodies()
        assert body["event"] == "idle_stop" and "sat idle" in body["title"]
        assert "data loader" in body["fix"]
        (ev,) = _events(record, "notify")
        _check_delivered(ev, stop, started)
        assert not _leaks(ws, [hook.secret_path], done.stdout, done.stderr)


def test_a_quarantined_checkpoint_is_told(tmp_path: Path) -> None:
    started = time.time()
    with WebhookReceiver() as hook:
        spec, ws = _job(tmp_path, CORRUPTS, f"""
            [limits]
            restart_backoff = 0
            [notify]
            webhook = "{hook.url}"
            events = ["checkpoint_quarantined", "attempt_failed", "accepted"]
            """)  # fmt: skip
        done = _cli("--workspace", str(ws), "run", str(spec), cwd=spec.parent)
        assert done.returncode == 0, done.stderr
        record = only_record_in(ws)
        (quarantine,) = _events(record, "checkpoint_quarantine")
        bodies = {b["event"]: b for b in hook.bodies()}
        assert set(bodies) == {"checkpoint_quarantined", "attempt_failed", "accepted"}, bodies
        told = bodies["checkpoint_quarantined"]
        assert "checkpoint at step 4 failed verification" in told["title"]
        assert "attempt 1 failed: killed" in bodies["attempt_failed"]["title"]
        (ev,) = [e for e in _events(record, "notify") if e["event"] == "checkpoint_quarantined"]
        _check_delivered(ev, quarantine, started)
        assert not _leaks(ws, [hook.secret_path], done.stdout, done.stderr)


def test_a_mirror_falling_behind_is_told_while_the_run_goes_on(tmp_path: Path) -> None:
    started = time.time()
    mirror, told, go = tmp_path / "mirror", tmp_path / "told.jsonl", tmp_path / "go"
    os.mkfifo(go)
    (tmp_path / "sink.py").write_text(textwrap.dedent(SINK))
    spec, ws = _job(tmp_path, MIRROR_LAGS, f"""
        env = {{ MIRROR = "{mirror}", MIRROR_GO = "{go}" }}
        [limits]
        max_restarts = 0
        [checkpoint]
        mirror = "{mirror}"
        [notify]
        command = ["{PYTHON}", "{tmp_path / 'sink.py'}", "{told}", "{go}"]
        command_events = ["mirror_behind"]
        """)  # fmt: skip
    done = _cli("--workspace", str(ws), "run", str(spec), cwd=spec.parent)
    record = only_record_in(ws)
    failed = [e for e in _events(record, "mirror_failed") if e.get("state") == "pending"]
    assert failed and failed[0]["step"] == 2, done.stdout + done.stderr
    (line,) = told.read_text().splitlines()  # once, though the upload failed each retry
    body = json.loads(line)["body"]
    assert body["event"] == "mirror_behind" and body["run"] == record.run_id
    assert "mirror is falling behind: step 2 not uploaded, retrying in" in body["title"]
    assert body["evidence"] == failed[0]["reason"][:300] and "reachable" in body["fix"]
    assert body["condition_t"] == pytest.approx(failed[0]["t"])
    (ev,) = [e for e in _events(record, "notify") if e["event"] == "mirror_behind"]
    _check_delivered(ev, failed[0], started)
    # The mirror came back: the step was uploaded after all, and nothing is behind at the end.
    assert any(e["step"] == 2 for e in _events(record, "mirror_ok")), done.stdout + done.stderr
    assert not _events(record, "mirror_behind")
    assert done.returncode == 0, done.stdout + done.stderr


LEAKS_A_TOKEN = """
import acceptrun
run = acceptrun.init()
for step in run.steps(0, 3):
    run.log(step, loss=1.0)
raise SystemExit("login refused for token=" + "hf_" + "Zq8xT2mPqv7RkL3nW9yB4cD1eF6gH0jKs")
"""


def test_a_secret_in_the_evidence_is_redacted_in_the_message(tmp_path: Path) -> None:
    token = "hf_" + "Zq8xT2mPqv7RkL3nW9yB4cD1eF6gH0jKs"
    with WebhookReceiver() as hook:
        spec, ws = _job(tmp_path, LEAKS_A_TOKEN, f"""
            [limits]
            max_restarts = 0
            [notify]
            webhook = "{hook.url}"
            events = ["attempt_failed", "rejected"]
            """)  # fmt: skip
        done = _cli("--workspace", str(ws), "run", str(spec), cwd=spec.parent)
        assert done.returncode == 1, done.stdout + done.stderr
        record = only_record_in(ws)
        bodies = {b["event"]: b for b in hook.bodies()}
        assert set(bodies) == {"attempt_failed", "rejected"}, bodies
        raw = json.dumps(list(hook.bodies()))
        assert token not in raw and token[:12] not in raw  # nor a prefix of it
        evidence = bodies["attempt_failed"]["evidence"]
        assert "login refused" in evidence, evidence  # the evidence is there, the token not
        assert "token=<redacted>" in evidence, evidence
        # The workload's own stderr.log is kept as it wrote it, and its stream is passed
        # through to the terminal (docs/reliability.md, Secrets); every file acceptrun
        # wrote from it, its own output (the verdict) and the message are redacted.
        assert token in record.file("attempts/1/stderr.log").read_text()
        kept = [f"runs/{record.run_id}/attempts/1/{n}.log" for n in ("stderr", "stdout")]
        leaks = _leaks(ws, [hook.secret_path, token], done.stdout)
        assert [x for x in leaks if x not in kept] == []


STEPS = """
import acceptrun
run = acceptrun.init()
for step in run.steps(0, 12):
    run.log(step, loss=1.0 / (1 + step))
"""


def test_a_receiver_that_never_answers_blocks_neither_supervision_nor_training(
    tmp_path: Path,
) -> None:
    with WebhookReceiver(hold=True) as hook:
        spec, ws = _job(tmp_path, STEPS, f"""
            [limits]
            restart_backoff = 0
            [notify]
            webhook = "{hook.url}"
            events = ["attempt_failed", "accepted"]
            timeout = "10m"
            close_wait = "1s"
            """)  # fmt: skip
        done = _cli("--workspace", str(ws), "run", "--inject", "kill@step=4", str(spec),
                    cwd=spec.parent)  # fmt: skip
        record = only_record_in(ws)
        assert done.returncode == 0, done.stdout + done.stderr
        assert record.state["verdict"] == "accepted"
        # The first message reached the receiver, which never answered it before the run
        # had ended: the supervisor restarted the run and attempt 2 ran every step after
        # the kill while it waited; the verdict's message queued behind it on that target.
        assert [b["event"] for b in hook.bodies()] == ["attempt_failed"]
        assert not hook.release.is_set()
        steps = sorted({e["step"] for e in _events(record, "step") if e.get("attempt") == 2})
        assert steps and steps[-1] == 11
        told = {e["event"]: e for e in _events(record, "notify")}
        assert told["attempt_failed"]["outcome"] == "not_delivered", told
        assert "notify.close_wait = 1 s" in told["attempt_failed"]["error"]
        assert told["accepted"]["outcome"] == "not_delivered", told
        assert "was not delivered" in done.stderr  # said loudly, not only recorded
