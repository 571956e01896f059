"""Where messages go: a JSON webhook, a Slack-compatible webhook, e-mail, a local command.

Each :class:`Target` sends one message per call (:meth:`Target.send`) and raises
:class:`DeliveryError` when the try failed; retries, backoff and the record of each
delivery are the dispatcher's (:mod:`acceptrun.notify.notifier`). A target's
:attr:`~Target.name` is what records show: its kind and, for a URL, the host alone (the URL
is a secret: its path is the credential of a Slack or generic webhook).

Every message leaves through the redactor, at the moment it is encoded (the registered
helpers of :mod:`acceptrun._util.egress`: :func:`~acceptrun._util.egress.json_body` for a
webhook, Slack and a command's stdin, :func:`~acceptrun._util.egress.email_message` for the
subject and body of an e-mail, :func:`~acceptrun._util.egress.command_env` for a command's
environment): an event quoted from the workload may hold a secret as it was written, and a
secret learned after the message was made (the SMTP password, at the first login) is
hidden too.
"""

from __future__ import annotations

import os
import smtplib
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from acceptrun._util.egress import command_env, email_message, json_body
from acceptrun._util.redact import learn, redact_record, redact_text
from acceptrun.spec.model import NotifySpec

__all__ = [
    "CommandTarget",
    "DeliveryError",
    "EmailTarget",
    "Target",
    "WebhookTarget",
    "targets_of",
]

_USER_AGENT = "acceptrun-notify"


class DeliveryError(Exception):
    """One try of one delivery failed; the message says why, without the target's URL."""


@dataclass
class Target:
    """One place messages go, and the events it wants."""

    kind: str  # webhook | slack | email | command
    events: tuple[str, ...]
    timeout_s: float

    @property
    def name(self) -> str:
        return self.kind

    def wants(self, event: str) -> bool:
        return event in self.events

    def send(self, message: dict[str, Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def _host_of(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or "?"
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "") + "/…"


@dataclass
class WebhookTarget(Target):
    """POST the message as JSON: the whole message (generic), or ``{"text": ...}`` (slack)."""

    url: str = ""

    @property
    def name(self) -> str:
        return f"{self.kind} {_host_of(self.url)}"

    def body(self, message: dict[str, Any]) -> bytes:
        if self.kind == "slack":
            return json_body({"text": message["text"]})
        return json_body(message)

    def send(self, message: dict[str, Any]) -> None:
        request = urllib.request.Request(
            self.url, data=self.body(message), method="POST",
            headers={"Content-Type": "application/json", "User-Agent": _USER_AGENT},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                status = answer.status
                answer.read(65536)
        except urllib.error.HTTPError as exc:
            raise DeliveryError(f"HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DeliveryError(f"{type(exc).__name__}: {reason}") from None
        if not 200 <= status < 300:
            raise DeliveryError(f"HTTP {status}")


@dataclass
class EmailTarget(Target):
    """One e-mail per message over SMTP, with STARTTLS and a login from the environment."""

    host: str = ""
    port: int = 587
    sender: str = ""
    to: tuple[str, ...] = ()
    starttls: bool = True
    user_env: str | None = None
    password_env: str | None = None

    @property
    def name(self) -> str:
        return f"email {self.host}:{self.port}"

    def __post_init__(self) -> None:
        # Hidden from the first message on, wherever it could recur (a failure the workload
        # printed, an SMTP error quoting it): not only once the first login read it.
        if self.password_env:
            learn([os.environ.get(self.password_env, "")])

    def _login(self) -> tuple[str, str] | None:
        if self.user_env is None:
            return None
        user = os.environ.get(self.user_env)
        password = os.environ.get(self.password_env, "") if self.password_env else ""
        if user is None:
            raise DeliveryError(f"${self.user_env} (notify.smtp_user_env) is not set")
        learn([password])
        return user, password

    def send(self, message: dict[str, Any]) -> None:
        login = self._login()
        mail = email_message(
            sender=self.sender, to=self.to, subject=f"[acceptrun] {message['title']}",
            body=message["text"] + "\n\n" + json_body(message, indent=2).decode(),
        )  # fmt: skip
        try:
            with smtplib.SMTP(self.host, self.port, timeout=self.timeout_s) as smtp:
                smtp.ehlo()
                if self.starttls:
                    smtp.starttls(context=ssl.create_default_context())
                    smtp.ehlo()
                if login is not None:
                    smtp.login(*login)
                smtp.send_message(mail)
        except (smtplib.SMTPException, OSError, ssl.SSLError) as exc:
            raise DeliveryError(f"{type(exc).__name__}: {exc}") from None


@dataclass
class CommandTarget(Target):
    """Run a local command per message: JSON on stdin, ACCEPTRUN_NOTIFY_* in the environment."""

    argv: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"command {os.path.basename(self.argv[0])}" if self.argv else "command"

    def send(self, message: dict[str, Any]) -> None:
        fields = ("event", "run", "title", "evidence", "fix", "report", "text")
        env = command_env(
            os.environ, {f"ACCEPTRUN_NOTIFY_{f.upper()}": message.get(f) or "" for f in fields}
        )
        try:
            done = subprocess.run(
                list(self.argv), input=json_body(message), env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=self.timeout_s,
                check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise DeliveryError(f"the command ran past {self.timeout_s:g} s") from None
        except OSError as exc:
            raise DeliveryError(f"{type(exc).__name__}: {exc}") from None
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise DeliveryError(f"exit {done.returncode}: {redact_text(tail[0][:200])}")


def targets_of(notify: NotifySpec) -> list[Target]:
    """The targets a [notify] section sets, each with the events it wants."""
    default = tuple(notify.events)
    timeout = float(notify.timeout)
    out: list[Target] = []
    if notify.webhook:
        out.append(WebhookTarget("webhook", tuple(notify.webhook_events) or default, timeout,
                                 url=notify.webhook))  # fmt: skip
    if notify.slack:
        out.append(WebhookTarget("slack", tuple(notify.slack_events) or default, timeout,
                                 url=notify.slack))  # fmt: skip
    if notify.email_to and notify.smtp_host and notify.email_from:
        out.append(EmailTarget(
            "email", tuple(notify.email_events) or default, timeout, host=notify.smtp_host,
            port=notify.smtp_port, sender=notify.email_from, to=tuple(notify.email_to),
            starttls=notify.smtp_starttls, user_env=notify.smtp_user_env,
            password_env=notify.smtp_password_env,
        ))  # fmt: skip
    if notify.command:
        out.append(CommandTarget("command", tuple(notify.command_events) or default, timeout,
                                 argv=tuple(notify.command)))  # fmt: skip
    return out


def outgoing(message: dict[str, Any]) -> dict[str, Any]:
    """The message as it leaves: every string through the redactor."""
    cleaned: dict[str, Any] = redact_record(message)
    return cleaned
