"""One serving attempt, beside the server process: wait for ready, drive the load, write results.

The supervisor starts the spec's command (the server) as the attempt, as it does a
training command, and then a :class:`ServingDriver` thread. The driver waits for
readiness (``ready_url`` answering 2xx, or a ``ready_log`` line in the server's output),
runs the load (:mod:`.load`), adds its requests to ``serving/requests.jsonl`` (one line
per request, with the attempt) and writes ``attempts/<n>/serving.json`` (cold start and the
figures of :mod:`.summary`) and the run-level ``serving.json`` over every attempt
(:mod:`.service`), then says it is finished; the supervisor stops the server (SIGTERM,
grace period, SIGKILL) and :meth:`ServingDriver.settle` names how the attempt ended:

- ``success``: the load ran to its end (the server's exit status after the stop is
  evidence, not a failure);
- ``not_ready``: no readiness within ``ready_timeout``; the evidence is the stderr tail;
  not retried (a restart would wait the same way).

A server that exits on its own keeps the supervisor's own classification; the driver
then stops its load and records what it measured so far as cut short, and how the attempt
ended: the next attempt's figures add to it, and the time between is downtime.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import psutil

from acceptrun._util.durable import read_jsonl, write_atomic, write_json_atomic
from acceptrun._util.userregex import UserPattern, compile_user_pattern
from acceptrun.record.status import AttemptOutcome
from acceptrun.record.workspace import RunRecord
from acceptrun.serving.load import LoadPlan, RequestResult, load_bodies, run_load
from acceptrun.serving.service import REQUESTS_FILE, attempt_file, write_service
from acceptrun.serving.summary import summarize
from acceptrun.spec.model import RunSpec

__all__ = ["ServingDriver"]

READY_POLL_S = 0.1  # seconds between readiness probes
TAIL_LINES = 12  # stderr lines kept as evidence when the server never becomes ready
# An attempt's outcomes when no stop ended it (supervisor.outcome.attempt_result): the
# server exited by itself, not by the supervisor's stop after the load or another stop.
ENDED_ON_ITS_OWN = frozenset(
    {AttemptOutcome.SUCCESS, AttemptOutcome.FAILED, AttemptOutcome.SIGNALED}
)


class ServingDriver(threading.Thread):
    """Readiness, load and results of one serving attempt (see the module docstring)."""

    def __init__(
        self,
        record: RunRecord,
        spec: RunSpec,
        attempt: int,
        *,
        launched_at: float,
        logs: tuple[Path, Path],
        pid: int | None = None,
    ) -> None:
        super().__init__(name=f"acceptrun-serving-{attempt}", daemon=True)
        self.record, self.spec, self.attempt = record, spec, attempt
        self.launched_at = launched_at  # time.time() when the server process started
        self.logs = logs  # the attempt's stdout.log and stderr.log
        self.pid = pid  # the server's process: gone when the load ends means it was cut short
        self.finished = threading.Event()
        self.cancelled = threading.Event()  # the server exited: stop the load
        self.outcome: str | None = None  # served | not_ready | interrupted
        self.stop_reason = ""
        self.count = 0
        self.exited_at: float | None = None  # time.time() when the supervisor saw it exit
        self.ready: dict[str, Any] = {"ok": True}  # _wait_ready's answer, once it has one

    # ---- the thread ----------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._serve()
        except Exception as exc:  # recorded: the verdict's serving checks then fail with it
            self.outcome = "failed"
            self.stop_reason = f"the load could not run: {type(exc).__name__}: {exc}"
            self._write({"ready": self.ready, "load_error": self.stop_reason})
            self.record.event(
                "serving_error", sync=True, attempt=self.attempt, error=self.stop_reason
            )
        finally:
            self.finished.set()

    def _serve(self) -> None:
        sv = self.spec.serving
        ready = self.ready = self._wait_ready()
        if not ready["ok"]:
            self.outcome = "not_ready"
            self.stop_reason = f"server not ready: {ready['reason']}"
            self._write({"ready": ready})
            self.record.event("serving_not_ready", sync=True, attempt=self.attempt, **ready)
            return
        self.record.event("serving_ready", sync=True, attempt=self.attempt, **ready)
        assert sv.url is not None
        plan = LoadPlan(
            url=sv.url, method=sv.method.upper(), bodies=load_bodies(sv.payload),
            headers=sv.headers, rate=sv.rate, arrivals=sv.arrivals, concurrency=sv.concurrency,
            duration=sv.duration, requests=sv.requests, stream=sv.stream,
            timeout=sv.request_timeout, seed=sv.seed,
        )  # fmt: skip
        self.record.event(
            "serving_load_start", sync=True, attempt=self.attempt, mode=(
                f"rate {sv.rate:g}/s" if sv.rate is not None else f"concurrency {sv.concurrency}"
            ),
        )  # fmt: skip
        load_t0 = time.time()
        results = run_load(plan, stop=self.cancelled)
        self.count = len(results)
        interrupted = None
        # The supervisor stops the server only after the load, so a server already gone (or
        # a zombie not yet reaped) exited on its own during it, even when the requests left
        # failed fast enough to end the load before the supervisor noticed.
        if self.cancelled.is_set() or not _server_alive(self.pid):
            interrupted = "the server exited during the load"
        self.outcome = "interrupted" if interrupted else "served"
        self._write_requests(results)
        first_ok = min((r.end for r in results if r.ok and r.end is not None), default=None)
        load = summarize(results, sv)
        summary: dict[str, Any] = {
            "ready": ready,
            "load_started_at": load_t0,
            "first_success_s": (
                None if first_ok is None else round(load_t0 - self.launched_at + first_ok, 6)
            ),
            "load": load,
            "interrupted": interrupted,
        }
        self._write(summary)
        self.record.event(
            "serving_done", sync=True, attempt=self.attempt, requests=load["requests"],
            ok=load["ok"], p99=load["latency"]["p99"], seconds=load["seconds"],
        )  # fmt: skip
        self.stop_reason = f"served {load['requests']:,} requests ({load['ok']:,} successful)"

    # ---- readiness -----------------------------------------------------------------------

    def _wait_ready(self) -> dict[str, Any]:
        sv = self.spec.serving
        deadline = self.launched_at + sv.ready_timeout
        pattern = (
            compile_user_pattern(sv.ready_log, where="serving.ready_log") if sv.ready_log else None
        )
        offsets = [0, 0]
        last_probe = ""
        while True:
            if pattern is not None and (line := self._log_match(pattern, offsets)) is not None:
                return self._ready(f"log line {line[:120]!r}")
            if sv.ready_url is not None:
                ok, last_probe = _probe(sv.ready_url)
                if ok:
                    return self._ready(f"{sv.ready_url} answered {last_probe}")
            if self.cancelled.is_set():
                return self._not_ready("the server exited before it was ready", last_probe)
            if time.time() >= deadline:
                return self._not_ready(
                    f"not ready {sv.ready_timeout:g}s after launch (serving.ready_timeout)",
                    last_probe,
                )
            time.sleep(READY_POLL_S)

    def _ready(self, by: str) -> dict[str, Any]:
        return {"ok": True, "seconds": round(time.time() - self.launched_at, 6), "by": by}

    def _not_ready(self, reason: str, probe: str) -> dict[str, Any]:
        from acceptrun.supervisor.classify import stderr_tail

        time.sleep(0.2)  # the server's last words reach its log through a pipe
        lines = [ln for ln in stderr_tail(self.logs[1]).splitlines() if ln.strip()]
        if probe:
            reason += f"; last probe of {self.spec.serving.ready_url}: {probe}"
        return {
            "ok": False,
            "seconds": round(time.time() - self.launched_at, 6),
            "reason": reason,
            "stderr_tail": lines[-TAIL_LINES:],
        }

    def _log_match(self, pattern: UserPattern, offsets: list[int]) -> str | None:
        for i, path in enumerate(self.logs):
            with contextlib.suppress(OSError), open(path, "rb") as f:
                f.seek(offsets[i])
                data = f.read()
                cut = data.rfind(b"\n") + 1  # whole lines only; the rest is read next time
                offsets[i] += cut
                for line in data[:cut].decode("utf-8", errors="replace").splitlines():
                    if pattern.search(line):
                        return line.strip()
        return None

    # ---- results -------------------------------------------------------------------------

    def _summary(self) -> dict[str, Any]:
        return self.record.read_json(attempt_file(self.attempt)) or {}

    def _write(self, summary: dict[str, Any]) -> None:
        """This attempt's summary, then the service's over every attempt (serving.json)."""
        summary = {"attempt": self.attempt, "launched_at": self.launched_at, **summary}
        path = self.record.file(attempt_file(self.attempt))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, summary)
        write_service(self.record, self.spec.serving)

    def _write_requests(self, results: list[RequestResult]) -> None:
        """Add this attempt's requests to the earlier attempts' (the file is rewritten whole)."""
        path = self.record.file(REQUESTS_FILE)
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = [d for d in read_jsonl(path) if d.get("attempt") != self.attempt]
        lines = [*kept, *({"attempt": self.attempt, **r.to_dict()} for r in results)]
        write_atomic(path, "".join(json.dumps(d, separators=(",", ":")) + "\n" for d in lines))

    # ---- the supervisor's side -----------------------------------------------------------

    def server_exited(self) -> None:
        """The server process ended: stop waiting and stop the load."""
        if self.exited_at is None:
            self.exited_at = time.time()
        self.cancelled.set()

    def settle(self, res: Any, returncode: int) -> None:
        """Name how the attempt ended (an AttemptResult, changed in place)."""
        from acceptrun.supervisor.classify import Classification

        ended = f"killed by {res.signal}" if res.signal else f"exit status {returncode}"
        if self.outcome == "served" and res.outcome in ENDED_ON_ITS_OWN:
            self._cut_short_after_all()
        if self.outcome == "served" and res.outcome == "serving":
            res.outcome = "success"
            res.reason = f"{self.stop_reason}; server stopped by the supervisor ({ended})"
            res.failure = None
        elif self.outcome == "failed" and res.outcome == "serving":
            res.outcome, res.reason = "load_failed", self.stop_reason
            res.failure = Classification(
                "user_error", [self.stop_reason, ended], False, self.stop_reason
            )
        elif self.outcome == "not_ready" and res.outcome == "serving":
            res.outcome = "not_ready"
            res.reason = self.stop_reason
            ready = self._summary().get("ready") or {}
            evidence = [self.stop_reason, *(ready.get("stderr_tail") or [])[-4:], ended]
            res.failure = Classification("not_ready", evidence, False, self.stop_reason)
        self._record_end(res)

    def _record_end(self, res: Any) -> None:
        """How the attempt ended, in its summary: the cause of any downtime after it."""
        summary = self._summary()
        if not summary:
            return  # the driver wrote nothing (it could not): the verdict says so
        summary["ended"] = {
            "outcome": res.outcome,
            "class": None if res.failure is None else res.failure.name,
            "reason": res.reason,
        }
        summary["exited_at"] = self.exited_at
        try:
            self._write(summary)
        except Exception as exc:  # never kills the supervisor: the figures stay as they were
            error = f"the serving summary could not be written: {type(exc).__name__}: {exc}"
            self.record.event("serving_error", sync=True, attempt=self.attempt, error=error)

    def _cut_short_after_all(self) -> None:
        """The server exited on its own before the supervisor stopped it, after the load.

        A process that exits closes its sockets a moment before it becomes a zombie, so a
        fast load can meet refused connections to a server that still looks alive when the
        load ends (see :func:`_server_alive`). The supervisor has now seen that exit: when
        requests failed, the load was cut short by it, and serving.json says so.
        """
        summary = self._summary()
        load = summary.get("load") or {}
        if summary.get("interrupted") or not load.get("errors"):
            return  # already said, or the load was served whole before the exit
        summary["interrupted"] = "the server exited during the load"
        write_json_atomic(self.record.file(attempt_file(self.attempt)), summary)
        self.outcome = "interrupted"  # serving.json follows in _record_end


def _probe(url: str) -> tuple[bool, str]:
    """One GET of the health URL: (answered 2xx, what happened)."""
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "127.0.0.1", parts.port, timeout=2.0)
    try:
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        resp = conn.getresponse()
        resp.read()
        return 200 <= resp.status < 300, f"HTTP {resp.status}"
    except (OSError, http.client.HTTPException) as exc:
        return False, f"{type(exc).__name__}: {exc}"[:200]
    finally:
        conn.close()


def _server_alive(pid: int | None) -> bool:
    """Whether the server process still runs (a zombie has exited); True when unknown."""
    if pid is None:
        return True
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True
