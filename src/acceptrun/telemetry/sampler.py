"""Host and GPU samplers: what the machine and the workload did, every interval.

The supervisor owns one :class:`RunTelemetry` per run. For each attempt it starts a
daemon thread that, every ``telemetry.interval`` seconds, appends to ``telemetry.jsonl``
one ``host`` line (:class:`HostSampler`: machine CPU, load, memory, the workload's
process tree, disk and network rates, free space) and one ``gpu`` line per GPU
(:class:`~acceptrun.telemetry.nvml.GpuSampler`), plus ``xid`` lines for NVML Xid events.
It also feeds the idle detector (:mod:`acceptrun.telemetry.idle`) and the live state
that the Prometheus endpoint (:mod:`acceptrun.telemetry.prometheus`) serves.

Rules (docs/telemetry.md has the record format):

- sampling never blocks or kills the run: a daemon thread, bounded work per tick, joined
  with a timeout at the attempt's end; an exception becomes one ``sampler_error`` line
  per distinct message and the next tick goes on;
- no GPU, no NVML, or ``telemetry.gpu = false``: one ``gpu_absent`` line per attempt;
- low cost: no process is spawned per sample, psutil ``Process`` objects are kept across
  ticks, NVML is opened once per run. At 1 Hz a tick costs a few milliseconds of CPU.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from acceptrun._util.durable import append_jsonl
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec
from acceptrun.telemetry.idle import IdleDetector, activity_of, describe
from acceptrun.telemetry.nvml import GpuSampler

__all__ = ["HostSampler", "LiveState", "RunTelemetry", "SamplerThread"]

JOIN_TIMEOUT_S = 5.0  # longest wait for the sampler thread at an attempt's end


class HostSampler:
    """Host samples: the machine and one process tree (the workload's).

    Rates (CPU %, disk and network bytes/s) are deltas since the previous sample, or since
    the sampler was created for the first one.
    """

    def __init__(self, pid: int, run_dir: Path, checkpoint_dir: Path) -> None:
        self.pid = pid
        self.run_dir = run_dir
        self.checkpoint_dir = checkpoint_dir
        self._root: psutil.Process | None = None
        # pid -> (Process, its user+system CPU seconds at the last tick)
        self._procs: dict[int, tuple[psutil.Process, float]] = {}
        self._t = time.monotonic()
        self._cpu = psutil.cpu_times()
        self._disk = _disk_bytes()
        self._net = _net_bytes()
        self.pids: set[int] = set()  # the tree's pids at the last tick

    def sample(self) -> dict[str, Any]:
        """One ``host`` record (without ``t``/``kind``/``attempt``)."""
        now = time.monotonic()
        dt = max(now - self._t, 1e-6)
        self._t = now
        cpu = psutil.cpu_times()
        busy, total = _busy(cpu, self._cpu)
        self._cpu = cpu
        mem = psutil.virtual_memory()
        proc_cpu_s, rss, count = self._tree()
        disk, net = _disk_bytes(), _net_bytes()
        out: dict[str, Any] = {
            "cpu_pct": round(100.0 * busy / total, 1) if total > 0 else None,
            "load1": round(os.getloadavg()[0], 2),
            "mem_used": int(mem.total - mem.available),
            "mem_total": int(mem.total),
            "proc_cpu_pct": round(100.0 * proc_cpu_s / dt, 1),
            "proc_rss": rss,
            "proc_count": count,
            "disk_read_bps": _rate(disk, self._disk, 0, dt),
            "disk_write_bps": _rate(disk, self._disk, 1, dt),
            "net_recv_bps": _rate(net, self._net, 0, dt),
            "net_sent_bps": _rate(net, self._net, 1, dt),
            "free_run_dir": _free_bytes(self.run_dir),
            "free_ckpt_dir": _free_bytes(self.checkpoint_dir),
        }
        self._disk, self._net = disk, net
        return out

    def _tree(self) -> tuple[float, int, int]:
        """CPU seconds used since the last tick, RSS (bytes) and count of the process tree."""
        try:
            if self._root is None:
                self._root = psutil.Process(self.pid)
            procs = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:  # the workload is gone (the attempt is ending)
            self._procs, self.pids = {}, set()
            return 0.0, 0, 0
        cpu_s, rss, seen, live = 0.0, 0, {}, set()
        for p in procs:
            cached = self._procs.get(p.pid)
            if cached is not None and cached[0] == p:  # same pid and start time: reuse
                p = cached[0]
            try:
                with p.oneshot():
                    # Exited, not yet reaped: its last CPU time counts, but it holds no
                    # memory and is not a running process of the tree.
                    zombie = p.status() == psutil.STATUS_ZOMBIE
                    t = p.cpu_times()
                    mem = None if zombie else p.memory_info()
            except psutil.Error:  # exited between the listing and the read
                continue
            used = t.user + t.system
            # A process new since the last tick counts all its CPU time (it began since).
            before = cached[1] if cached is not None and cached[0] == p else 0.0
            cpu_s += max(0.0, used - before)
            seen[p.pid] = (p, used)
            if mem is not None:
                rss += int(mem.rss)
                live.add(p.pid)
        self._procs = seen
        self.pids = live
        return cpu_s, rss, len(live)


def _busy(now: Any, before: Any) -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine between two psutil.cpu_times()."""
    total = sum(now) - sum(before)
    idle = (now.idle - before.idle) + (getattr(now, "iowait", 0.0) - getattr(before, "iowait", 0.0))
    return max(0.0, total - idle), total


def _disk_bytes() -> tuple[int, int] | None:
    try:
        io = psutil.disk_io_counters(perdisk=False)
    except (OSError, RuntimeError):  # no /proc/diskstats in some containers
        return None
    return None if io is None else (int(io.read_bytes), int(io.write_bytes))


def _net_bytes() -> tuple[int, int] | None:
    try:
        io = psutil.net_io_counters(pernic=False)
    except (OSError, RuntimeError):
        return None
    return None if io is None else (int(io.bytes_recv), int(io.bytes_sent))


def _rate(
    now: tuple[int, int] | None, before: tuple[int, int] | None, i: int, dt: float
) -> float | None:
    if now is None or before is None:
        return None
    return round(max(0, now[i] - before[i]) / dt, 1)  # counters can wrap or reset: never < 0


def _free_bytes(path: Path) -> int | None:
    """Free bytes on the file system of ``path`` (or of its nearest existing parent)."""
    for p in (path, *path.parents):
        try:
            return int(shutil.disk_usage(p).free)
        except FileNotFoundError:
            continue
        except OSError:
            return None
    return None


@dataclass
class LiveState:
    """What the run is doing now: read by the Prometheus endpoint at each scrape.

    Written by the supervisor (attempt, watch) and the sampler thread (samples); read
    without a lock: each field is replaced whole, never mutated in place.
    """

    run_id: str
    name: str
    attempt: int = 0
    restarts: int = 0
    watch: Any = None  # the attempt's supervisor.watch.AttemptWatch (steps, loss)
    host: dict[str, Any] | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    idle: IdleDetector | None = None
    spend: Callable[[], float | None] | None = None  # USD so far, when the run is priced


class SamplerThread(threading.Thread):
    """One attempt's sampling loop (a daemon thread); see the module docstring."""

    def __init__(
        self,
        record: RunRecord,
        attempt: int,
        interval: float,
        host: HostSampler,
        gpu: GpuSampler | None,
        *,
        idle: IdleDetector | None = None,
        live: LiveState | None = None,
        prepare: Callable[[SamplerThread], None] | None = None,
    ) -> None:
        super().__init__(name=f"acceptrun-telemetry-{attempt}", daemon=True)
        self.prepare = prepare  # run first, in the thread (NVML's start-up can take a second)
        self.record = record
        self.attempt = attempt
        self.interval = interval
        self.host = host
        self.gpu = gpu
        self.idle = idle
        self.live = live
        self.ticks = 0
        self._halt = threading.Event()
        self._errors: set[tuple[str, str]] = set()

    def halt(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Stop after the current tick; wait at most ``timeout`` seconds for it."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout)

    def run(self) -> None:
        prepare = self.prepare
        if prepare is not None:
            self._guard("gpu", lambda: prepare(self))
        next_t = time.monotonic() + self.interval
        while not self._halt.wait(max(0.0, next_t - time.monotonic())):
            next_t += self.interval
            if next_t < time.monotonic():  # a slow tick: skip the missed ones, no burst
                next_t = time.monotonic() + self.interval
            self.tick()

    def tick(self) -> None:
        """Take one round of samples and hand them on (never raises)."""
        t = time.time()
        host = self._guard("host", self.host.sample)
        gpus: list[dict[str, Any]] = []
        xids: list[dict[str, Any]] = []
        gpu, idle = self.gpu, self.idle
        if gpu is not None:
            gpus = self._guard("gpu", lambda: gpu.sample(self.host.pids)) or []
            xids = self._guard("gpu", gpu.xid_events) or []
        if host is not None:
            self.write({"t": t, "kind": "host", "attempt": self.attempt, **host})
        for g in gpus:
            self.write({"t": t, "kind": "gpu", "attempt": self.attempt, **g})
        for x in xids:
            self.write({"t": t, "kind": "xid", **x})
            self._guard("gpu", partial(self.record.event, "xid", attempt=self.attempt, **x))
        self.ticks += 1
        if self.live is not None:
            self.live.host, self.live.gpus = host, gpus
        if idle is not None:
            activity = activity_of(host, gpus, self.host.pids)
            self._guard("idle", lambda: idle.observe(t, activity))

    def error(self, sampler: str, message: str) -> None:
        """Write a ``sampler_error`` line, once per distinct (sampler, message)."""
        key = (sampler, message[:500])
        if key in self._errors:
            return
        self._errors.add(key)
        self.write({"t": time.time(), "kind": "sampler_error", "sampler": sampler, "error": key[1]})

    def _guard(self, sampler: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # recorded, and sampling goes on (never kills the run)
            self.error(sampler, f"{type(exc).__name__}: {exc}")
            return None

    def write(self, obj: dict[str, Any]) -> None:
        # A full disk: the run's own writes say so; samples are best effort.
        with contextlib.suppress(Exception):
            append_jsonl(self.record.telemetry_path, obj)


class RunTelemetry:
    """The supervisor's telemetry for one run: samplers, idle detection, Prometheus.

    >>> tel = RunTelemetry(record, spec)
    >>> tel.open()                                     # Prometheus, when asked for
    >>> tel.begin(attempt=1, pid=child.pid, watch=watch, checkpoint_dir=ckpt)
    >>> tel.idle                                       # the attempt's IdleDetector (stops.Idle)
    >>> tel.end()                                      # at the attempt's end
    >>> tel.close()                                    # at the run's end
    """

    def __init__(
        self,
        record: RunRecord,
        spec: RunSpec,
        *,
        say: Callable[[str], None] = lambda _msg: None,
        prometheus_port: int | None = None,
        spend: Callable[[], float | None] | None = None,
        gpu: GpuSampler | None = None,
    ) -> None:
        self.record = record
        self.spec = spec
        self.say = say
        port = spec.telemetry.prometheus_port if prometheus_port is None else prometheus_port
        self.prometheus_port = port
        self.live = LiveState(record.run_id, spec.name, spend=spend)
        self._gpu = gpu
        self._gpu_absent: str | None = None
        self._gpu_opened = False
        self._server: Any = None
        self.thread: SamplerThread | None = None
        self.idle: IdleDetector | None = None

    def open(self) -> None:
        """Start the Prometheus endpoint when the spec or ``--prometheus-port`` asks for it."""
        if self.prometheus_port is None or self._server is not None:
            return
        try:
            from acceptrun.telemetry.prometheus import MetricsServer

            self._server = MetricsServer(self.live, self.prometheus_port)
            url = self._server.start()
        except Exception as exc:  # a busy port must not stop the run; it is recorded
            self._server = None
            msg = f"{type(exc).__name__}: {exc}"
            self.record.event("prometheus_failed", sync=True, port=self.prometheus_port, error=msg)
            self.say(f"prometheus endpoint on port {self.prometheus_port} failed: {msg}")
            return
        self.record.event("prometheus", sync=True, url=url)
        self.say(f"prometheus metrics at {url}")

    def begin(self, attempt: int, pid: int, watch: Any, checkpoint_dir: Path) -> None:
        """Start sampling an attempt whose workload process is ``pid``."""
        self.end()
        tel, limits = self.spec.telemetry, self.spec.limits
        self.idle = IdleDetector(
            threshold=tel.idle_threshold,
            window=None if limits.idle_window is None else float(limits.idle_window),
            action=tel.idle_action,
            attempt=attempt,
            on_event=self._event,
        )
        self.live.attempt = attempt
        self.live.watch = watch
        self.live.idle = self.idle
        self.live.restarts = sum(1 for _ in self.record.events("restart"))
        host = HostSampler(pid, self.record.path, checkpoint_dir)
        self.thread = SamplerThread(
            self.record, attempt, float(tel.interval), host, None,
            idle=self.idle, live=self.live, prepare=self._prepare_gpu,
        )  # fmt: skip
        self.thread.start()

    def _event(self, kind: str, fields: dict[str, Any]) -> None:
        self.record.event(kind, sync=True, **fields)
        if kind == "idle" and self.spec.telemetry.idle_action != "stop":
            self.say(
                f"attempt {fields['attempt']}: {describe(fields)}; the run goes on "
                '(telemetry.idle_action = "event")'
            )

    def _prepare_gpu(self, thread: SamplerThread) -> None:
        """In the sampler thread: NVML opened once per run, or one ``gpu_absent`` line."""
        if not self.spec.telemetry.gpu:
            self._gpu_absent = "telemetry.gpu = false"
        elif not self._gpu_opened:
            self._gpu_opened = True
            self._gpu = self._gpu or GpuSampler()
            self._gpu_absent = self._gpu.open()
        if self._gpu_absent is not None or self._gpu is None:
            thread.write({"t": time.time(), "kind": "gpu_absent", "reason": self._gpu_absent})
            return
        self._gpu.on_error = lambda msg: thread.error("gpu", msg)
        thread.gpu = self._gpu

    def end(self) -> None:
        """Stop sampling the current attempt (joined with a timeout; never raises)."""
        thread, self.thread = self.thread, None
        if thread is not None:
            thread.halt()

    def close(self) -> None:
        """At the run's end: stop sampling, close NVML and the Prometheus endpoint."""
        self.end()
        if self._gpu is not None and self._gpu_opened:
            self._gpu.close()
        server, self._server = self._server, None
        if server is not None:
            server.close()
