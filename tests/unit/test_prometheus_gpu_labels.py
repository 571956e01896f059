"""The Prometheus endpoint's GPU metrics: the gpu label, unknown values left out (a real
run's endpoint: tests/integration/test_prometheus.py)."""

from __future__ import annotations

from acceptrun.telemetry.prometheus import MetricsServer
from acceptrun.telemetry.sampler import LiveState
from conftest import metric_value, scrape_metrics


def test_gpu_metrics_carry_the_gpu_label_and_unknown_values_are_left_out() -> None:
    live = LiveState("20260101-000000-x-abcd", "x", attempt=2, restarts=1)
    live.host = {"cpu_pct": 12.5, "proc_rss": 1000, "load1": None}
    live.gpus = [
        {"index": 0, "util_pct": 97.0, "mem_used": 5, "mem_total": 10, "power_w": 300.5,
         "temp_c": 70, "sm_active_pct": None},
        {"index": 1, "util_pct": 3.0, "mem_used": 1, "mem_total": 10, "power_w": None,
         "temp_c": 40, "sm_active_pct": None},
    ]  # fmt: skip
    live.spend = lambda: 1.25
    server = MetricsServer(live, 0)
    url = server.start()
    try:
        metrics = scrape_metrics(url)
    finally:
        server.close()
    assert sorted(metrics["acceptrun_gpu_utilization_percent"], key=lambda x: x[0]["gpu"]) == [
        ({"gpu": "0"}, 97.0),
        ({"gpu": "1"}, 3.0),
    ]
    assert metrics["acceptrun_gpu_power_watts"] == [({"gpu": "0"}, 300.5)]
    assert "acceptrun_gpu_sm_active_percent" not in metrics
    assert "acceptrun_host_load1" not in metrics and "acceptrun_step" not in metrics
    assert metric_value(metrics, "acceptrun_host_cpu_percent") == 12.5
    assert (
        metric_value(metrics, "acceptrun_attempt") == 2
        and metric_value(metrics, "acceptrun_restarts") == 1
    )
    assert metric_value(metrics, "acceptrun_cost_usd") == 1.25
