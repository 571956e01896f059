"""A Prometheus ``/metrics`` endpoint on 127.0.0.1 while a run is supervised.

Turned on by ``telemetry.prometheus_port`` (0 picks a free port) or ``acceptrun run
--prometheus-port N``. It uses its own ``CollectorRegistry`` (never the process-global
one) and a collector that reads the supervisor's :class:`~acceptrun.telemetry.sampler.
LiveState` at each scrape, so nothing is computed between scrapes: the cost of the
endpoint is the cost of the scrapes.

Metrics (all gauges, prefix ``acceptrun_``): ``run_info{run_id,name}``, ``attempt``,
``restarts``, ``step``, ``last_step_timestamp_seconds``, ``step_time_seconds``, ``samples_per_second``,
``tokens_per_second``, ``data_wait_share``, ``loss``, ``host_cpu_percent``,
``host_load1``, ``host_memory_used_bytes``, ``host_memory_total_bytes``,
``process_cpu_percent``, ``process_rss_bytes``, ``process_count``,
``gpu_utilization_percent{gpu}``, ``gpu_memory_used_bytes{gpu}``,
``gpu_memory_total_bytes{gpu}``, ``gpu_power_watts{gpu}``, ``gpu_temperature_celsius{gpu}``,
``gpu_sm_active_percent{gpu}``, ``idle_seconds``, ``cost_usd``. A value not known yet is
left out rather than reported as 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from acceptrun._util.units import finite_number as _num
from acceptrun.telemetry.sampler import LiveState

__all__ = ["MetricsServer", "RunCollector"]

HOST = "127.0.0.1"  # loopback only: the endpoint has no authentication

_HOST_METRICS = (
    ("host_cpu_percent", "cpu_pct", "CPU use of the whole machine, %."),
    ("host_load1", "load1", "One-minute load average of the machine."),
    ("host_memory_used_bytes", "mem_used", "Memory in use on the machine (total - available)."),
    ("host_memory_total_bytes", "mem_total", "Memory of the machine."),
    ("process_cpu_percent", "proc_cpu_pct", "CPU use of the workload's processes, % of one core."),
    ("process_rss_bytes", "proc_rss", "Resident memory of the workload's processes."),
    ("process_count", "proc_count", "Processes in the workload's tree."),
)
_GPU_METRICS = (
    ("gpu_utilization_percent", "util_pct", "GPU utilization, %."),
    ("gpu_memory_used_bytes", "mem_used", "GPU memory in use."),
    ("gpu_memory_total_bytes", "mem_total", "GPU memory."),
    ("gpu_power_watts", "power_w", "GPU power draw, W."),
    ("gpu_power_limit_watts", "power_limit_w", "Enforced GPU power limit, W."),
    ("gpu_temperature_celsius", "temp_c", "GPU temperature, degrees C."),
    ("gpu_sm_active_percent", "sm_active_pct", "SM activity from GPM, %."),
)


class RunCollector(Collector):
    """Builds the metric families from a :class:`LiveState` at each scrape."""

    def __init__(self, live: LiveState) -> None:
        self.live = live

    def collect(self) -> Iterator[Metric]:
        live = self.live
        info = InfoMetricFamily("acceptrun_run", "The supervised run.", labels=["run_id", "name"])
        info.add_metric([live.run_id, live.name], {})
        yield info
        yield from self._gauge("attempt", "Attempt number of the running attempt.", live.attempt)
        yield from self._gauge("restarts", "Restarts so far.", live.restarts)
        yield from self._steps()
        host = live.host or {}
        for name, key, doc in _HOST_METRICS:
            yield from self._gauge(name, doc, host.get(key))
        gpus = list(live.gpus)
        for name, key, doc in _GPU_METRICS:
            family = GaugeMetricFamily(f"acceptrun_{name}", doc, labels=["gpu"])
            for g in gpus:
                value = _num(g.get(key))
                if value is not None:
                    family.add_metric([str(g.get("index"))], value)
            if family.samples:
                yield family
        if live.idle is not None:
            yield from self._gauge(
                "idle_seconds", "Seconds the workload has been idle (current streak).",
                live.idle.idle_seconds,
            )  # fmt: skip
        if live.spend is not None:
            yield from self._gauge("cost_usd", "Compute spend so far, USD.", live.spend())

    def _steps(self) -> Iterator[Metric]:
        watch = self.live.watch
        if watch is None:
            return
        ev = getattr(watch, "last_step_event", None) or {}
        yield from self._gauge("step", "Last step logged by the workload.", watch.last_step)
        yield from self._gauge(
            "last_step_timestamp_seconds", "When the last step was logged, unix s.", ev.get("t")
        )
        step_time = _num(ev.get("step_time"))
        yield from self._gauge("step_time_seconds", "Time of the last step, s.", step_time)
        for unit in ("samples", "tokens"):
            n = _num(ev.get(unit))
            if n is not None and step_time:
                yield from self._gauge(
                    f"{unit}_per_second", f"{unit.capitalize()} per second (last step).",
                    n / step_time,
                )  # fmt: skip
        total = _num(getattr(watch, "step_time_total", None))
        wait = _num(getattr(watch, "data_wait_total", None))
        if total and wait is not None:
            yield from self._gauge(
                "data_wait_share", "Share of step time spent waiting for data (attempt).",
                wait / total,
            )  # fmt: skip
        yield from self._gauge("loss", "Last loss logged.", watch.last_loss)

    @staticmethod
    def _gauge(name: str, doc: str, value: Any) -> Iterator[Metric]:
        v = _num(value)
        if v is not None:
            yield GaugeMetricFamily(f"acceptrun_{name}", doc, value=v)


class MetricsServer:
    """The HTTP endpoint: :meth:`start` returns its URL, :meth:`close` shuts it down.

    >>> server = MetricsServer(live, 0)
    >>> server.start()
    'http://127.0.0.1:40123/metrics'
    """

    def __init__(self, live: LiveState, port: int) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RunCollector(live))
        self.port = port
        self._server: Any = None
        self._thread: Any = None

    def start(self) -> str:
        """Serve on 127.0.0.1 (port 0: a free one); raises OSError when the port is taken."""
        self._server, self._thread = start_http_server(self.port, addr=HOST, registry=self.registry)
        self.port = int(self._server.server_address[1])
        return f"http://{HOST}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port (safe to call twice)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
