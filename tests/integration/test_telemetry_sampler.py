"""Host and GPU samplers: a real supervised run writes telemetry.jsonl by the contract, the
process tree is measured, a failing sampler is recorded once and sampling goes on, and
the NVML sampler decodes what a GPU reports (through a stand-in: this machine has none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from acceptrun._util.durable import read_jsonl
from acceptrun.record.workspace import RunRecord
from acceptrun.run.launch import launch
from acceptrun.spec.model import parse_spec
from acceptrun.telemetry.nvml import GpuSampler, decode_clock_events, xid_detail
from acceptrun.telemetry.sampler import HostSampler, RunTelemetry, SamplerThread

HOST_KEYS = {
    "t", "kind", "attempt", "cpu_pct", "load1", "mem_used", "mem_total", "proc_cpu_pct",
    "proc_rss", "proc_count", "disk_read_bps", "disk_write_bps", "net_recv_bps",
    "net_sent_bps", "free_run_dir", "free_ckpt_dir",
}  # fmt: skip
GPU_KEYS = {
    "t", "kind", "attempt", "index", "name", "util_pct", "mem_util_pct", "mem_used",
    "mem_total", "power_w", "power_limit_w", "temp_c", "sm_clock_mhz", "mem_clock_mhz",
    "clock_events", "ecc_corrected", "ecc_uncorrected", "procs", "sm_active_pct",
}  # fmt: skip

LOOP = """
import time, acceptrun
run = acceptrun.init()
for step in run.steps(25):
    t = time.perf_counter()
    while time.perf_counter() - t < 0.04:  # busy: CPU the sampler must see
        pass
    run.log(step, loss=1.0 / (step + 1), samples=8)
"""


def telemetry(record: RunRecord) -> list[dict[str, Any]]:
    return list(read_jsonl(record.telemetry_path))


@pytest.mark.slow
def test_supervised_run_writes_host_samples_and_gpu_absent(tmp_path: Path) -> None:
    (tmp_path / "work.py").write_text(textwrap.dedent(LOOP))
    (tmp_path / "spec.toml").write_text(
        f'name = "tel"\ncommand = ["{sys.executable}", "work.py"]\n[telemetry]\ninterval = "0.2s"\n'
    )
    result = launch(tmp_path / "spec.toml", workspace=tmp_path / "ws", echo=False)
    assert result.exit_code == 0, result.verdict
    lines = telemetry(result.record)
    absent = [x for x in lines if x["kind"] == "gpu_absent"]
    assert len(absent) == 1 and absent[0]["reason"]  # this machine has no NVIDIA GPU
    hosts = [x for x in lines if x["kind"] == "host"]
    assert len(hosts) >= 3, lines
    for h in hosts:
        assert set(h) == HOST_KEYS
        assert h["attempt"] == 1
        assert 0 < h["mem_used"] <= h["mem_total"]
        assert h["free_run_dir"] > 0 and h["free_ckpt_dir"] > 0
    # While the workload runs, its tree is measured (a tick just after its exit sees none).
    alive = [h for h in hosts if h["proc_count"] >= 1]
    assert len(alive) >= 3 and all(h["proc_rss"] > 0 for h in alive)
    # The loop spins ~1 s of CPU: some interval must show it busy (generous: shared CPUs).
    assert max(h["proc_cpu_pct"] for h in hosts) > 20
    assert [x["t"] for x in hosts] == sorted(x["t"] for x in hosts)
    assert not [x for x in lines if x["kind"] == "sampler_error"]


def test_host_sampler_measures_the_whole_process_tree(tmp_path: Path) -> None:
    # A parent that sleeps and a grandchild that spins: the tree's CPU is the grandchild's.
    script = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        host = HostSampler(proc.pid, tmp_path, tmp_path / "missing" / "ckpt")
        time.sleep(1.0)
        first = host.sample()
        time.sleep(1.0)
        second = host.sample()
    finally:
        for child in _children(proc.pid):
            child.kill()
        proc.kill()
        proc.wait()
    assert first["proc_count"] == 2 and second["proc_count"] == 2
    assert second["proc_rss"] > first["proc_rss"] / 2 > 0
    assert second["proc_cpu_pct"] > 30  # one core spinning; shared CPUs keep it generous
    assert len(host.pids) == 2 and proc.pid in host.pids
    assert second["free_ckpt_dir"] == second["free_run_dir"] or second["free_ckpt_dir"] > 0


def _children(pid: int) -> list[Any]:
    import psutil

    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


class FlakyHost(HostSampler):
    """A host sampler that fails on ticks 2 and 3 with the same message, then recovers."""

    calls = 0

    def sample(self) -> dict[str, Any]:
        self.calls += 1
        if self.calls in (2, 3):
            raise RuntimeError("cannot read /proc/stat")
        return super().sample()


def test_a_failing_sampler_is_recorded_once_and_sampling_goes_on(tmp_path: Path) -> None:
    record = RunRecord(tmp_path)
    host = FlakyHost(os.getpid(), tmp_path, tmp_path)
    thread = SamplerThread(record, 1, 0.05, host, None)
    thread.start()
    deadline = time.monotonic() + 20
    while thread.ticks < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    thread.halt()
    assert not thread.is_alive()
    lines = telemetry(record)
    errors = [x for x in lines if x["kind"] == "sampler_error"]
    assert errors == [
        {
            "t": errors[0]["t"],
            "kind": "sampler_error",
            "sampler": "host",
            "error": "RuntimeError: cannot read /proc/stat",
        }
    ]
    kinds = [x["kind"] for x in lines]
    # Samples before the failure, one error line, and samples after it again.
    assert kinds[0] == "host" and kinds[1] == "sampler_error" and kinds.count("host") >= 4


def test_run_telemetry_respects_gpu_false_and_joins_its_thread(tmp_path: Path) -> None:
    record = RunRecord(tmp_path)
    spec = parse_spec(
        'name = "x"\ncommand = ["true"]\n[telemetry]\ninterval = "0.05s"\ngpu = false\n'
    )
    tel = RunTelemetry(record, spec)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tel.begin(1, proc.pid, None, tmp_path / "ckpt")
        deadline = time.monotonic() + 20
        while (
            time.monotonic() < deadline
            and sum(1 for x in telemetry(record) if x["kind"] == "host") < 2
        ):
            time.sleep(0.05)
        thread = tel.thread
        tel.close()
    finally:
        proc.kill()
        proc.wait()
    assert thread is not None and not thread.is_alive()
    lines = telemetry(record)
    assert lines[0] == {"t": lines[0]["t"], "kind": "gpu_absent", "reason": "telemetry.gpu = false"}
    assert next(x for x in lines if x["kind"] == "host")["proc_count"] == 1


# ---- NVML ----------------------------------------------------------------------------------


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__({3: "Not Supported", 15: "GPU is lost", 10: "Timeout"}[value])
        self.value = value


class FakeNVML:
    """The few pynvml functions GpuSampler calls, answering like one H100 would."""

    NVMLError = FakeNVMLError

    def __init__(self) -> None:
        self.shutdown = False
        self.xids = [79]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def nvmlDeviceGetIndex(self, handle: str) -> int:
        return int(handle[1:])

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return _obj(total=80 * 2**30, used=12 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return _obj(gpu=97, memory=40)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 650_500  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:
        return 700_000

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        return 71

    def nvmlDeviceGetClockInfo(self, h: str, clock: int) -> int:
        return {1: 1980, 2: 2619}[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        return 0x05  # gpu_idle (left out) + sw_power_cap

    def nvmlDeviceGetTotalEccErrors(self, h: str, kind: int, counter: int) -> int:
        if kind == 1:
            raise FakeNVMLError(15)  # a real failure: reported, the field is None
        return 2

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        return [_obj(pid=4242, usedGpuMemory=11 * 2**30), _obj(pid=7, usedGpuMemory=None)]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: str) -> list[Any]:
        raise FakeNVMLError(3)  # not supported: quiet

    def nvmlGpmQueryDeviceSupport(self, h: str) -> Any:
        return _obj(isSupportedDevice=0)

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceRegisterEvents(self, h: str, kinds: int, events: str) -> None: ...

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        if not self.xids:
            raise FakeNVMLError(10)
        return _obj(device="h0", eventType=0x8, eventData=self.xids.pop())

    def nvmlEventSetFree(self, events: str) -> None: ...


def _obj(**fields: Any) -> Any:
    return type("Obj", (), fields)()


def test_gpu_sampler_reads_every_field_and_reports_real_errors() -> None:
    errors: list[str] = []
    nvml = FakeNVML()
    gpus = GpuSampler(nvml, on_error=errors.append)
    assert gpus.open() is None
    (g,) = gpus.sample({4242})
    assert set(g) | {"t", "kind", "attempt"} >= GPU_KEYS
    assert g["name"] == "NVIDIA H100 80GB HBM3" and g["index"] == 0
    assert (g["util_pct"], g["mem_util_pct"]) == (97.0, 40.0)
    assert (g["mem_used"], g["mem_total"]) == (12 * 2**30, 80 * 2**30)
    assert (g["power_w"], g["power_limit_w"], g["temp_c"]) == (650.5, 700.0, 71)
    assert (g["sm_clock_mhz"], g["mem_clock_mhz"]) == (1980, 2619)
    assert g["clock_events"] == ["sw_power_cap"]
    assert (g["ecc_corrected"], g["ecc_uncorrected"]) == (2, None)
    assert g["procs"] == {"4242": 11 * 2**30, "7": None}
    assert g["sm_active_pct"] is None  # no GPM on this device
    assert errors == ["nvmlDeviceGetTotalEccErrors: GPU is lost"]  # not-supported is quiet
    xids = gpus.xid_events()
    assert xids == [{"index": 0, "xid": 79, "detail": xid_detail(79, 0, g["name"])}]
    assert "fallen off the bus" in xids[0]["detail"]
    assert gpus.xid_events() == []  # drained; the wait never blocks
    gpus.close()
    assert nvml.shutdown


def test_without_nvml_the_gpu_sampler_says_why() -> None:
    reason = GpuSampler().open()  # the real pynvml: this machine has no NVIDIA driver
    if reason is None:
        pytest.skip(
            "NVML loaded here (an NVIDIA driver is installed): this test is for machines "
            "without one; the GPU path is covered by bench/gpu_check_telemetry.py"
        )
    assert reason.startswith("NVML")


def test_clock_event_names() -> None:
    assert decode_clock_events(None) is None
    assert decode_clock_events(0) == []
    assert decode_clock_events(0x01) == []  # idle clocks are not a slowdown
    assert decode_clock_events(0x4 | 0x8 | 0x40) == [
        "sw_power_cap",
        "hw_slowdown",
        "hw_thermal_slowdown",
    ]


def test_telemetry_lines_are_json_objects_one_per_line(tmp_path: Path) -> None:
    record = RunRecord(tmp_path)
    thread = SamplerThread(record, 3, 1.0, HostSampler(os.getpid(), tmp_path, tmp_path), None)
    thread.tick()
    thread.tick()
    raw = record.telemetry_path.read_bytes().splitlines()
    assert len(raw) == 2
    assert all(json.loads(r)["attempt"] == 3 for r in raw)
