"""A cloud's preemption notice: the workload checkpoints and stops inside it.

A spot or preemptible machine is taken back with a short notice, which each provider
publishes on the machine's own metadata service, documented as:

- AWS (``"aws"``): ``GET /latest/meta-data/spot/instance-action`` answers 404 until the
  instance is to be interrupted, then ``{"action": "terminate" | "stop" | "hibernate",
  "time": "2026-12-07T12:00:00Z"}``, about two minutes ahead (IMDSv2: a session token from
  ``PUT /latest/api/token`` first, sent as ``X-aws-ec2-metadata-token``);
- Google Cloud (``"gcp"``): ``GET /computeMetadata/v1/instance/preempted`` with
  ``Metadata-Flavor: Google`` answers ``TRUE`` once preemption began (30 s of notice);
- Azure (``"azure"``): ``GET /metadata/scheduledevents?api-version=2020-07-01`` with
  ``Metadata: true`` lists events; one with ``EventType: "Preempt"`` is the eviction, its
  ``NotBefore`` the earliest it happens (at least 30 s ahead).

:class:`NoticeWatch` looks every ``limits.preemption_notice_poll`` seconds on a thread of
its own (a look is bounded by :data:`LOOK_TIMEOUT_S`; a metadata service that does not
answer is said once, as a ``preemption_notice_unavailable`` event, and looked at again).
When the notice comes it records ``preemption_notice`` (provider, action, deadline); the
supervisor's next poll takes it as a stop (supervisor/stops.py ``Notice``, class
``preempted``): SIGTERM to the workload ("checkpoint now, then exit"), then the grace
period, and no restart on this machine (``acceptrun resume`` continues the run elsewhere,
from the mirror). The verdict's ``preemption notice`` check proves the save:
the step saved, how long after the notice, inside the deadline or not, the steps lost.
"""

from __future__ import annotations

import email.utils
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec

__all__ = ["LOOK_TIMEOUT_S", "Notice", "NoticeWatch", "look", "notice_watch"]

LOOK_TIMEOUT_S = 2.0  # seconds one look at the metadata service may take
_BASE = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}
_AWS_TOKEN_TTL_S = 21600


@dataclass(frozen=True, slots=True)
class Notice:
    """A preemption notice: what the provider will do, and by when (unix s, when said)."""

    provider: str
    action: str
    deadline: float | None


def look(provider: str, base: str | None = None) -> Notice | None:
    """One look at ``provider``'s notice; None while there is none. Raises OSError (URLError
    included) when the metadata service cannot be asked."""
    root = (base or _BASE[provider]).rstrip("/")
    if provider == "aws":
        return _aws(root)
    if provider == "gcp":
        return _gcp(root)
    if provider == "azure":
        return _azure(root)
    raise ValueError(f"no preemption notice is known for {provider!r}")


def _get(url: str, headers: dict[str, str], method: str = "GET") -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=LOOK_TIMEOUT_S) as answer:
            return int(answer.status), answer.read(1 << 16)
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""


def _aws(root: str) -> Notice | None:
    status, token = _get(
        f"{root}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": str(_AWS_TOKEN_TTL_S)},
        method="PUT",
    )  # fmt: skip
    headers = {"X-aws-ec2-metadata-token": token.decode()} if status == 200 else {}
    status, body = _get(f"{root}/latest/meta-data/spot/instance-action", headers)
    if status == 404:
        return None
    if status != 200:
        raise OSError(f"spot/instance-action answered HTTP {status}")
    action = _json(body)
    when = action.get("time")
    return Notice("aws", str(action.get("action") or "terminate"), _iso(when))


def _gcp(root: str) -> Notice | None:
    status, body = _get(
        f"{root}/computeMetadata/v1/instance/preempted", {"Metadata-Flavor": "Google"}
    )
    if status != 200:
        raise OSError(f"instance/preempted answered HTTP {status}")
    if body.strip().upper() != b"TRUE":
        return None
    return Notice("gcp", "preempt", time.time() + 30.0)  # documented: 30 s from its start


def _azure(root: str) -> Notice | None:
    status, body = _get(
        f"{root}/metadata/scheduledevents?api-version=2020-07-01", {"Metadata": "true"}
    )
    if status != 200:
        raise OSError(f"scheduledevents answered HTTP {status}")
    for event in _json(body).get("Events") or []:
        if isinstance(event, dict) and event.get("EventType") == "Preempt":
            return Notice("azure", "preempt", _http_date(event.get("NotBefore")))
    return None


def _json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"{}")
    except ValueError as exc:
        raise OSError(f"the metadata service answered what is not JSON: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _iso(value: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _http_date(value: Any) -> float | None:
    try:
        return email.utils.parsedate_to_datetime(str(value)).timestamp()
    except (TypeError, ValueError):
        return None


class NoticeWatch:
    """Looks for the provider's notice until it comes (:attr:`notice`) or :meth:`stop`."""

    def __init__(
        self, record: RunRecord, provider: str, *, every_s: float, base: str | None = None
    ) -> None:
        self.record = record
        self.provider = provider
        self.every_s = every_s
        self.base = base
        self.notice: Notice | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._said_unavailable = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="acceptrun-notice", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(LOOK_TIMEOUT_S * 3)

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self.check():
                return
            self._stop.wait(self.every_s)

    def check(self) -> bool:
        """One look; True once the notice came (recorded; :attr:`notice` set)."""
        try:
            notice = look(self.provider, self.base)
        except (OSError, ValueError) as exc:
            if not self._said_unavailable:
                self._said_unavailable = True
                self.record.event(
                    "preemption_notice_unavailable", sync=True, provider=self.provider,
                    error=str(getattr(exc, "reason", exc)),
                )  # fmt: skip
            return False
        if notice is None:
            return False
        deadline = notice.deadline
        self.record.event(
            "preemption_notice", sync=True, provider=notice.provider, action=notice.action,
            deadline=None if deadline is None else round(deadline, 3),
        )  # fmt: skip
        self.notice = notice  # after its event: the stop that follows is recorded after it
        return True


def notice_watch(record: RunRecord, spec: RunSpec) -> NoticeWatch | None:
    """The watch ``limits.preemption_notice`` asks for (not started), or None."""
    lim = spec.limits
    if lim.preemption_notice == "none":
        return None
    return NoticeWatch(
        record, lim.preemption_notice, every_s=lim.preemption_notice_poll,
        base=lim.preemption_notice_url,
    )  # fmt: skip
