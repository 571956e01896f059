"""Host and GPU samplers: a real supervised run writes telemetry.jsonl by the contract, the
process tree is measured, a failing sampler is recorded once and sampling goes on, and
the NVML sampler decodes what a GPU reports (through a stand-in: this machine has none)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from acceptrun._util.durable import read_jsonl
from acceptrun.record.workspace import RunRecord
from acceptrun.telemetry.nvml import GpuSampler, decode_clock_events, xid_detail
from acceptrun.telemetry.sampler import HostSampler, SamplerThread

GPU_KEYS = {
    "t", "kind", "attempt", "index", "name", "util_pct", "mem_util_pct", "mem_used",
    "mem_total", "power_w", "power_limit_w", "temp_c", "sm_clock_mhz", "mem_clock_mhz",
    "clock_events", "ecc_corrected", "ecc_uncorrected", "procs", "sm_active_pct",
}  # fmt: skip


def telemetry(record: RunRecord) -> list[dict[str, Any]]:
    return list(read_jsonl(record.telemetry_path))


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
