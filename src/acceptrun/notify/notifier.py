"""Delivery: follow a run's events as they are written and tell the targets, in the background.

One mechanism for every condition: the :class:`Notifier` follows events.jsonl (the record
every part of acceptrun already writes to: the supervisor, the workload, checkpoints, the
close), turns each line into a condition (:func:`acceptrun.notify.conditions.condition_of`)
and hands it to a :class:`Dispatcher`. No feature calls the notifier: a condition is told
because it was recorded.

The dispatcher gives each target its own thread and a bounded queue
(:data:`QUEUE_MAX` messages), so a slow SMTP server never holds up a webhook, and nothing
here ever blocks the supervisor or the training loop: a full queue drops the message and
records that. A try that fails is tried again after ``notify.retry_backoff``, doubling
(at most :data:`MAX_BACKOFF_S`), up to ``notify.retries`` tries. The same condition is
sent once per target: its key (``divergence:1``: the kind and what tells it apart) is
remembered, and read back from the record's earlier ``notify`` events, so a resume does
not send it again.

Every delivery is recorded, whatever became of it: a ``notify`` event with the target
(its kind and host, never the URL), the event, the condition's own time, the delivery
time, time to detect, the tries and the outcome (``delivered``, ``failed``, ``dropped``,
``not_delivered`` when the close could wait no longer). One that is not delivered is also
a warning line: silence would be the worst failure here.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from acceptrun._util.durable import loads_json, read_jsonl
from acceptrun.notify.conditions import Condition, condition_of
from acceptrun.notify.secrets import notify_spec_of
from acceptrun.notify.targets import DeliveryError, Target, outgoing, targets_of
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import NotifySpec, RunSpec

__all__ = ["MAX_BACKOFF_S", "POLL_S", "QUEUE_MAX", "Dispatcher", "Notifier", "start_notifier"]

log = logging.getLogger("acceptrun")

POLL_S = 0.25  # seconds between reads of events.jsonl: the follower's part of time to detect
QUEUE_MAX = 256  # messages waiting per target; past it a message is dropped (and recorded)
MAX_BACKOFF_S = 300.0  # the longest wait between two tries of one delivery
_READ_MAX = 16 << 20  # bytes of events.jsonl read per poll at most


@dataclass
class _Job:
    condition: Condition
    message: dict[str, Any]


class Dispatcher:
    """Deliver conditions to a run's targets in the background, and record every delivery."""

    def __init__(
        self,
        record: RunRecord,
        notify: NotifySpec,
        *,
        name: str | None = None,
        by: str = "supervisor",
        targets: list[Target] | None = None,
    ) -> None:
        # Its own handle on the record: its appends never flush another thread's step log
        # (AppendLog's lock and O_APPEND keep the lines whole and in order).
        self.record = RunRecord(record.path)
        self.notify = notify
        self.name = name
        self.by = by  # who delivers: supervisor | watch
        self.targets = targets_of(notify) if targets is None else targets
        self._sent = _delivered_keys(record)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending: dict[int, tuple[Target, _Job]] = {}  # id -> job, queued or in flight
        self._abandon = threading.Event()  # set when the close could wait no longer
        self._queues: dict[str, queue.Queue[_Job | None]] = {}
        self._threads: list[threading.Thread] = []
        for target in self.targets:
            q: queue.Queue[_Job | None] = queue.Queue(maxsize=QUEUE_MAX)
            self._queues[target.name] = q
            thread = threading.Thread(
                target=self._work, args=(target, q), name=f"acceptrun-notify-{target.kind}",
                daemon=True,
            )  # fmt: skip
            thread.start()
            self._threads.append(thread)

    def submit(self, condition: Condition) -> None:
        """Queue ``condition`` for each target that wants its kind; never blocks."""
        message = outgoing(condition.message(self.name))
        for target in self.targets:
            if not target.wants(condition.kind):
                continue
            key = f"{target.name}|{condition.key}"
            job = _Job(condition, message)
            with self._lock:
                if key in self._sent or self._abandon.is_set():
                    continue
                self._sent.add(key)
                self._pending[id(job)] = (target, job)
            try:
                self._queues[target.name].put_nowait(job)
            except queue.Full:
                with self._lock:
                    self._pending.pop(id(job), None)
                self._record(target, condition, "dropped", 0,
                             error=f"{QUEUE_MAX} messages were waiting for this target")  # fmt: skip

    def _work(self, target: Target, q: queue.Queue[_Job | None]) -> None:
        while (job := q.get()) is not None:
            try:
                self._deliver(target, job)
            except Exception as exc:  # a bug here must not end the thread unrecorded
                self._record(
                    target, job.condition, "failed", 0, error=f"{type(exc).__name__}: {exc}"
                )
            finally:
                with self._lock:
                    self._pending.pop(id(job), None)
                    self._idle.notify_all()

    def _deliver(self, target: Target, job: _Job) -> None:
        tries = max(1, int(self.notify.retries))
        wait = float(self.notify.retry_backoff)
        error = ""
        for n in range(1, tries + 1):
            if self._abandon.is_set():
                return  # the close recorded it as not delivered
            try:
                target.send(job.message)
            except DeliveryError as exc:
                error = str(exc)
            else:
                delivered = time.time()
                # Recorded while still pending (the close waits for it: the report has it);
                # also after the close gave up on it: it did arrive, and the record says so.
                self._record(target, job.condition, "delivered", n, delivered_at=delivered)
                return
            if n < tries and self._abandon.wait(min(wait, MAX_BACKOFF_S)):
                return
            wait *= 2
        with self._lock:  # unless the close already recorded it as not delivered
            if id(job) in self._pending:
                self._record(target, job.condition, "failed", tries, error=error)

    def _record(
        self,
        target: Target,
        condition: Condition,
        outcome: str,
        tries: int,
        *,
        delivered_at: float | None = None,
        error: str | None = None,
    ) -> None:
        fields: dict[str, Any] = {
            "target": target.name, "event": condition.kind, "key": condition.key,
            "condition": condition.source, "condition_t": round(condition.t, 6),
            "outcome": outcome, "attempts": tries, "by": self.by,
        }  # fmt: skip
        if condition.attempt is not None:
            fields["attempt"] = condition.attempt
        if delivered_at is not None:
            fields["delivered_at"] = round(delivered_at, 6)
            fields["time_to_detect_s"] = round(delivered_at - condition.t, 3)
        if error:
            fields["error"] = error
        try:
            self.record.event("notify", sync=True, **fields)
            where = f"recorded in {self.record.events_path}"
        except OSError as exc:  # a full or read-only record: the warning says so as well
            where = f"recording it failed too ({exc})"
        if outcome != "delivered":
            log.warning(
                "notify: %s of run %s was not delivered to %s (%s after %d tries: %s); %s",
                condition.kind, self.record.run_id, target.name, outcome, tries,
                error or "no reason", where,
            )  # fmt: skip

    def wait(self, timeout_s: float) -> bool:
        """Wait until nothing is queued or in flight, at most ``timeout_s``; True when idle."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self, wait_s: float) -> None:
        """Deliver what is queued within ``wait_s``; record the rest as not delivered."""
        self.wait(wait_s)
        with self._lock:
            self._abandon.set()
            left = list(self._pending.values())
            self._pending.clear()
        for target, job in left:
            self._record(target, job.condition, "not_delivered", 0,
                         error=f"the run ended before it was delivered (notify.close_wait = {wait_s:g} s)")  # fmt: skip
        for q in self._queues.values():
            # Full: abandoned, the thread stops at its next check (a daemon meanwhile).
            with contextlib.suppress(queue.Full):
                q.put_nowait(None)


def _delivered_keys(record: RunRecord) -> set[str]:
    """target|key of every delivery the record already holds (a resume sends none again)."""
    keys: set[str] = set()
    for ev in read_jsonl(record.events_path):
        if ev.get("kind") == "notify" and ev.get("outcome") == "delivered":
            keys.add(f"{ev.get('target')}|{ev.get('key')}")
    return keys


class Notifier:
    """Follow one run's events.jsonl in a thread; each condition goes to the dispatcher."""

    def __init__(self, record: RunRecord, dispatcher: Dispatcher, *, from_end: bool) -> None:
        self.record = record
        self.dispatcher = dispatcher
        path = record.events_path
        self._offset = path.stat().st_size if from_end and path.exists() else 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="acceptrun-notify-follow",
                                        daemon=True)  # fmt: skip
        self._closed = False

    def start(self) -> Notifier:
        self._thread.start()
        return self

    def _follow(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.read_new()
            except Exception as exc:  # never ends the run; said once, loudly
                log.warning("notify: following %s failed: %s: %s; no further messages for "
                            "run %s", self.record.events_path, type(exc).__name__, exc,
                            self.record.run_id)  # fmt: skip
                return

    def read_new(self) -> None:
        """Read the complete lines written since the last read; submit their conditions."""
        try:
            with open(self.record.events_path, "rb") as f:
                f.seek(self._offset)
                data = f.read(_READ_MAX)
        except FileNotFoundError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        self._offset += end + 1
        for line in data[: end + 1].splitlines():
            try:
                event = loads_json(line)
            except ValueError:
                continue  # damage: the record's readers report it
            if not isinstance(event, dict):
                continue
            condition = condition_of(event, self.record.run_id, self.record.path)
            if condition is not None:
                self.dispatcher.submit(condition)

    def close(self) -> None:
        """Stop following after a last read, then give deliveries ``notify.close_wait``."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        try:
            self.read_new()
        except OSError as exc:
            log.warning("notify: the last read of %s failed: %s", self.record.events_path, exc)
        self.dispatcher.close(float(self.dispatcher.notify.close_wait))


def start_notifier(record: RunRecord, spec: RunSpec, *, from_end: bool = False) -> Notifier | None:
    """Start following ``record`` when its spec sets a target; None when it sets none.

    ``from_end``: a resume, whose earlier events were told by the run before it.
    """
    try:
        notify = notify_spec_of(record, spec)
        if not notify.enabled:
            return None
        dispatcher = Dispatcher(record, notify, name=spec.name)
        return Notifier(record, dispatcher, from_end=from_end).start()
    except Exception as exc:  # never the run's failure: recorded and said, then it runs on
        error = f"{type(exc).__name__}: {exc}"
        log.warning("notify: run %s sends no messages: %s", record.run_id, error)
        with contextlib.suppress(OSError):
            record.event("best_effort_failed", sync=True, component="notify", error=error)
        return None
