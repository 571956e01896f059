"""GPU samples through NVML (``nvidia-ml-py``, imported as ``pynvml``).

:class:`GpuSampler` opens NVML once, keeps one handle per device, and each tick returns
one ``gpu`` record per device (fields in docs/telemetry.md): utilization, memory, power
and its limit, temperature, SM and memory clocks, the active clock-event (throttle)
reasons by name, volatile ECC totals, memory per process, and SM activity from GPM on
GPUs that support it (Hopper and newer). Xid errors arrive through an NVML event set,
drained without blocking at each tick.

A field the GPU does not report (NVML_ERROR_NOT_SUPPORTED, no permission) is ``None``;
any other NVML error on a field is passed to ``on_error`` (the sampler writes it once as
a ``sampler_error`` line) and the field is ``None`` too, so one broken query never hides
the others. Cost per tick and GPU: about ten NVML calls, well under a millisecond each.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["CLOCK_EVENTS", "GpuSampler", "decode_clock_events", "xid_detail"]

# Clock-event (throttle) reason bits of nvmlDeviceGetCurrentClocksEventReasons, by name.
# "gpu_idle" is left out: clocks drop because nothing runs, which util_pct already says,
# and a reader counting "throttled" samples must not count idle ones.
CLOCK_EVENTS = (
    (0x0002, "applications_clocks_setting"),
    (0x0004, "sw_power_cap"),
    (0x0008, "hw_slowdown"),
    (0x0010, "sync_boost"),
    (0x0020, "sw_thermal_slowdown"),
    (0x0040, "hw_thermal_slowdown"),
    (0x0080, "hw_power_brake_slowdown"),
    (0x0100, "display_clock_setting"),
)

# What the common Xid numbers mean (NVIDIA's Xid catalog), for the `detail` of an xid line.
XID_MEANING = {
    13: "graphics engine exception (often a bug in the workload: an illegal access)",
    31: "GPU memory page fault (often an illegal address in the workload)",
    43: "GPU stopped processing (a user application fault)",
    45: "preemptive cleanup after a fault (follows another Xid)",
    48: "double-bit ECC error: the GPU needs a reset",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error: the application was stopped",
    95: "uncontained ECC error: the GPU needs a reset",
    119: "GSP RPC timeout",
    120: "GSP error",
}

# NVML return codes that mean "this GPU cannot report that": the field becomes None quietly.
_QUIET = {3, 4, 13}  # NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND (older driver)
_NVML_TIMEOUT = 10  # NVML_ERROR_TIMEOUT: an event-set wait found nothing
_NVML_FUNCTION_NOT_FOUND = 13  # NVML_ERROR_FUNCTION_NOT_FOUND: an older driver
_XID_EVENT = 0x0000000000000008  # nvmlEventTypeXidCriticalError
_MAX_XID_PER_TICK = 32  # bounded work per tick, even when a GPU floods events


def decode_clock_events(mask: int | None) -> list[str] | None:
    """Names of the active clock-event reasons in an NVML bit mask (``None`` stays ``None``).

    >>> decode_clock_events(0x0C)
    ['sw_power_cap', 'hw_slowdown']
    """
    if mask is None:
        return None
    return [name for bit, name in CLOCK_EVENTS if mask & bit]


def xid_detail(xid: int, index: int, name: str | None) -> str:
    """One sentence for an Xid event: the number, the GPU, and what it usually means."""
    meaning = XID_MEANING.get(xid, "see NVIDIA's Xid catalog")
    return f"Xid {xid} on GPU {index}" + (f" ({name})" if name else "") + f": {meaning}"


class _Device:
    """One GPU's NVML handle, its static facts, and its GPM samples."""

    def __init__(self, index: int, handle: Any) -> None:
        self.index = index
        self.handle = handle
        self.name: str | None = None
        self.mem_total: int | None = None
        self.gpm: list[Any] | None = None  # [previous, current] GPM samples when supported
        self.gpm_primed = False


class GpuSampler:
    """NVML samples of every GPU of the machine; see the module docstring.

    >>> gpus = GpuSampler()
    >>> gpus.open()           # None when ready, else why there is no GPU sampling
    'NVML Shared Library Not Found'
    """

    def __init__(
        self, nvml: Any = None, *, on_error: Callable[[str], None] = lambda _msg: None
    ) -> None:
        self._nvml = nvml  # the pynvml module, or a stand-in with the same functions
        self.on_error = on_error
        self.devices: list[_Device] = []
        self._events: Any = None
        self._open = False
        self._lock = threading.Lock()  # one tick at a time, even if an old thread lingers

    # ---- lifetime -------------------------------------------------------------------------

    def open(self) -> str | None:
        """Initialise NVML and find the GPUs: None when ready, else the reason (for gpu_absent)."""
        if self._open:
            return None
        if self._nvml is None:
            try:
                import pynvml
            except ImportError as exc:  # nvidia-ml-py is a dependency; a broken install says so
                return f"nvidia-ml-py is not importable ({exc})"
            self._nvml = pynvml
        nv = self._nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            return f"NVML unavailable: {exc}"
        except OSError as exc:
            return f"NVML unavailable: {exc}"
        try:
            count = int(nv.nvmlDeviceGetCount())
            self.devices = [_Device(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        except nv.NVMLError as exc:
            self._shutdown()
            return f"NVML found no usable GPU: {exc}"
        if not self.devices:
            self._shutdown()
            return "NVML reports no GPU on this machine"
        for dev in self.devices:
            name = self._get(nv.nvmlDeviceGetName, dev.handle)
            dev.name = name.decode() if isinstance(name, bytes) else name
            mem = self._get(nv.nvmlDeviceGetMemoryInfo, dev.handle)
            dev.mem_total = int(mem.total) if mem is not None else None
            dev.gpm = self._gpm_setup(dev)
        self._events = self._event_setup()
        self._open = True
        return None

    def close(self) -> None:
        """Free the event set and GPM samples, shut NVML down; safe to call twice."""
        if not self._open:
            return
        nv = self._nvml
        if not self._lock.acquire(timeout=2.0):
            return  # a tick stuck in the driver: leave NVML to the process's exit
        try:
            for dev in self.devices:
                for s in dev.gpm or []:
                    self._get(nv.nvmlGpmSampleFree, s)
                dev.gpm = None
            if self._events is not None:
                self._get(nv.nvmlEventSetFree, self._events)
                self._events = None
            self._shutdown()
        finally:
            self._lock.release()

    def _shutdown(self) -> None:
        self._open = False
        with contextlib.suppress(Exception):  # shutting down must never fail the run
            self._nvml.nvmlShutdown()

    # ---- sampling -------------------------------------------------------------------------

    def sample(self, pids: Iterable[int] = ()) -> list[dict[str, Any]]:
        """One ``gpu`` record per device (without ``t``/``kind``/``attempt``).

        ``pids`` are the workload's processes: the records say which GPUs they use.
        """
        if not self._open or not self._lock.acquire(blocking=False):
            return []
        try:
            return [self._sample_device(dev) for dev in self.devices]
        finally:
            self._lock.release()

    def _sample_device(self, dev: _Device) -> dict[str, Any]:
        nv, h = self._nvml, dev.handle
        util = self._get(nv.nvmlDeviceGetUtilizationRates, h)
        mem = self._get(nv.nvmlDeviceGetMemoryInfo, h)
        power = self._get(nv.nvmlDeviceGetPowerUsage, h)  # milliwatts
        limit = self._get(nv.nvmlDeviceGetEnforcedPowerLimit, h)  # milliwatts
        reasons = self._clock_event_mask(h)
        sm_util, sm_occ = self._gpm_metrics(dev)
        return {
            "index": dev.index,
            "name": dev.name,
            "util_pct": None if util is None else float(util.gpu),
            "mem_util_pct": None if util is None else float(util.memory),
            "mem_used": None if mem is None else int(mem.used),
            "mem_total": dev.mem_total if mem is None else int(mem.total),
            "power_w": None if power is None else round(power / 1000.0, 1),
            "power_limit_w": None if limit is None else round(limit / 1000.0, 1),
            "temp_c": self._get(nv.nvmlDeviceGetTemperature, h, 0),  # NVML_TEMPERATURE_GPU
            "sm_clock_mhz": self._get(nv.nvmlDeviceGetClockInfo, h, 1),  # NVML_CLOCK_SM
            "mem_clock_mhz": self._get(nv.nvmlDeviceGetClockInfo, h, 2),  # NVML_CLOCK_MEM
            "clock_events": decode_clock_events(reasons),
            # (error type: 0 corrected, 1 uncorrected; counter 0: volatile, since boot)
            "ecc_corrected": self._get(nv.nvmlDeviceGetTotalEccErrors, h, 0, 0),
            "ecc_uncorrected": self._get(nv.nvmlDeviceGetTotalEccErrors, h, 1, 0),
            "procs": self._processes(h),
            "sm_active_pct": sm_util,
            "sm_occupancy_pct": sm_occ,
        }

    def _clock_event_mask(self, handle: Any) -> int | None:
        nv = self._nvml
        # ...ClocksEventReasons is the newer name (driver 535+); older drivers have only
        # ...ClocksThrottleReasons, which the newer name's "function not found" falls back to.
        for fn_name in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            fn = getattr(nv, fn_name, None)
            if fn is None:
                continue
            try:
                return int(fn(handle))
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) == _NVML_FUNCTION_NOT_FOUND:
                    continue
                self._nvml_error(fn, exc)
                return None
        return None

    def _processes(self, handle: Any) -> dict[str, int | None] | None:
        nv = self._nvml
        found: dict[str, int | None] = {}
        got_any = False
        for fn_name in (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        ):
            fn = getattr(nv, fn_name, None)
            procs = self._get(fn, handle) if fn is not None else None
            if procs is None:
                continue
            got_any = True
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                prev = found.get(str(p.pid))
                value = None if used is None else int(used)
                found[str(p.pid)] = value if prev is None else prev + (value or 0)
        return found if got_any else None

    # ---- GPM (SM activity, Hopper and newer) ------------------------------------------------

    def _gpm_setup(self, dev: _Device) -> list[Any] | None:
        nv = self._nvml
        query = getattr(nv, "nvmlGpmQueryDeviceSupport", None)
        if query is None:
            return None
        support = self._get(query, dev.handle)
        if support is None or not support.isSupportedDevice:
            return None
        first = self._get(nv.nvmlGpmSampleAlloc)
        second = self._get(nv.nvmlGpmSampleAlloc)
        if first is None or second is None:
            return None
        return [first, second]

    def _gpm_metrics(self, dev: _Device) -> tuple[float | None, float | None]:
        """SM activity and occupancy (%) between the previous tick's GPM sample and this one."""
        if dev.gpm is None:
            return None, None
        nv = self._nvml
        prev, cur = dev.gpm
        if self._get(nv.nvmlGpmSampleGet, dev.handle, cur) is None:
            dev.gpm_primed = False
            return None, None
        dev.gpm = [cur, prev]  # this sample is the next tick's "previous"
        if not dev.gpm_primed:
            dev.gpm_primed = True
            return None, None  # GPM needs two samples: the first tick has no interval
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = 2
        req.sample1 = prev
        req.sample2 = cur
        req.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
        req.metrics[1].metricId = nv.NVML_GPM_METRIC_SM_OCCUPANCY
        if self._get(nv.nvmlGpmMetricsGet, req) is None:
            return None, None
        out: list[float | None] = []
        for m in (req.metrics[0], req.metrics[1]):
            out.append(round(float(m.value), 2) if int(m.nvmlReturn) == 0 else None)
        return out[0], out[1]

    # ---- Xid events ---------------------------------------------------------------------------

    def _event_setup(self) -> Any:
        nv = self._nvml
        events = self._get(nv.nvmlEventSetCreate)
        if events is None:
            return None
        registered = False
        for dev in self.devices:
            try:
                nv.nvmlDeviceRegisterEvents(dev.handle, _XID_EVENT, events)
                registered = True
            except nv.NVMLError as exc:
                self._nvml_error(nv.nvmlDeviceRegisterEvents, exc)
        if not registered:
            self._get(nv.nvmlEventSetFree, events)
            return None
        return events

    def xid_events(self) -> list[dict[str, Any]]:
        """Xid events since the last call (``index``, ``xid``, ``detail``); never blocks."""
        if not self._open or self._events is None:
            return []
        nv = self._nvml
        found: list[dict[str, Any]] = []
        for _ in range(_MAX_XID_PER_TICK):
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)  # 0 ms: what is queued, no wait
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) != _NVML_TIMEOUT:
                    self._nvml_error(nv.nvmlEventSetWait_v2, exc)
                break
            if not int(data.eventType) & _XID_EVENT:
                continue
            index = self._get(nv.nvmlDeviceGetIndex, data.device)
            index = -1 if index is None else int(index)
            name = next((d.name for d in self.devices if d.index == index), None)
            xid = int(data.eventData)
            found.append({"index": index, "xid": xid, "detail": xid_detail(xid, index, name)})
        return found

    # ---- errors ---------------------------------------------------------------------------------

    def _get(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, or None when NVML cannot answer (reported unless "not supported")."""
        nv = self._nvml
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            return self._nvml_error(fn, exc)

    def _nvml_error(self, fn: Any, exc: Exception) -> Any:
        """Report ``exc`` unless it means "not supported"; the field's value is then None."""
        if getattr(exc, "value", None) not in _QUIET:
            self.on_error(f"{getattr(fn, '__name__', fn)}: {exc}")
        return None
