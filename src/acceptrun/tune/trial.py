"""One tune trial, run in a fresh child process: ``python -m acceptrun.tune.trial JOB RESULT``.

A fresh process per trial keeps trials apart: clean peak-memory counters (CUDA's
``max_memory_allocated``, or the process's max RSS on a CPU), no compiled graph or
allocator cache carried over, and a trial that crashes or runs out of memory takes only
itself down. The job is a JSON file written by :mod:`acceptrun.tune.sweep`; the result,
a JSON object, is written atomically to RESULT (no result file: the child died).

Modes: ``probe`` (the device: CUDA or CPU, its name and memory), ``trial`` (time a
configuration) and ``search`` (the largest batch that fits, :mod:`acceptrun.tune.search`).
With ``memory_limit`` the child caps its own address space (``RLIMIT_AS``) after torch is
imported, so on a CPU a batch too large fails for real, with the allocator's error.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import statistics
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

__all__ = ["is_oom", "main", "run_trial", "search_batch"]

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "bad_alloc")
# Under an address-space cap oneDNN reports a failed allocation of its scratch memory only
# as a primitive it could not create.
LIMITED_OOM_MARKERS = ("could not create a primitive",)
_limited = False


def is_oom(exc: BaseException) -> bool:
    """True for an allocation failure: CUDA OOM, MemoryError, the CPU allocator's error."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    if _limited and any(m in text for m in LIMITED_OOM_MARKERS):
        return True
    return type(exc).__name__ == "OutOfMemoryError" or any(m in text for m in OOM_MARKERS)


def _describe(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:300]}"


def _vm_size() -> int:
    """This process's virtual memory size in bytes (Linux /proc)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


def limit_address_space(extra_bytes: int) -> int:
    """Cap this process's address space at its current size plus ``extra_bytes``.

    Called after torch is imported, so the limit is what the model, optimizer state and
    activations may take, not torch's own libraries. Returns the cap in bytes.
    """
    global _limited
    cap = _vm_size() + int(extra_bytes)
    _limited = True
    resource.setrlimit(resource.RLIMIT_AS, (cap, resource.RLIM_INFINITY))
    return cap


def _max_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


# ---- the training step under a configuration ---------------------------------------------


def _to_device(batch: Any, device: Any, non_blocking: bool) -> Any:
    if hasattr(batch, "to"):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: _to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(_to_device(v, device, non_blocking) for v in batch)
    return batch


class _Stepper:
    """Build once, then run training steps of a configuration: precision, attention, scaler."""

    def __init__(self, target: Any, config: Any, device: Any, *, compile_model: bool) -> None:
        import torch

        self.torch = torch
        self.config = config
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            tf32 = config.precision == "tf32"
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
        self.built = target.build(config, device)
        self.model = self.built.model
        self.step_model = self.model
        if compile_model and config.compile:
            self.step_model = torch.compile(self.model, mode=config.compile)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.precision)
        self.scaler = torch.amp.GradScaler(device.type) if config.precision == "fp16" else None
        self.overflow_steps = 0
        self.loader_iter: Iterator[Any] | None = None
        self.loader: Any = None
        loader_fn = getattr(target, "dataloader", None)
        if callable(loader_fn):
            self.loader = loader_fn(config, device)

    def _attention(self) -> Any:
        if not self.config.attention:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {
            "math": SDPBackend.MATH,
            "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION,
        }[self.config.attention]
        return sdpa_kernel(backend)

    def _autocast(self) -> Any:
        if self.dtype is None:
            return contextlib.nullcontext()
        return self.torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def next_batch(self, batch_size: int) -> Any:
        if self.loader is None:
            return self.built.make_batch(batch_size)
        if self.loader_iter is None:
            self.loader_iter = iter(self.loader)
        try:
            batch = next(self.loader_iter)
        except StopIteration:  # an epoch ended: start the next one
            self.loader_iter = iter(self.loader)
            batch = next(self.loader_iter)
        return _to_device(batch, self.device, self.config.pin_memory and self.cuda)

    def step(self, batch_size: int) -> float:
        """One optimizer step; returns the loss. Ends in a device sync (the loss value)."""
        opt = self.built.optimizer
        batch = self.next_batch(batch_size)
        with self._autocast(), self._attention():
            loss = self.built.loss_fn(self.step_model, batch)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            scale = self.scaler.get_scale()
            self.scaler.step(opt)
            self.scaler.update()
            if self.scaler.get_scale() < scale:  # inf/nan gradients: the step was skipped
                self.overflow_steps += 1
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
        value = float(loss.detach().float().item())  # a CPU-GPU sync point, wanted here
        if self.cuda:
            self.torch.cuda.synchronize()
        return value

    def free(self) -> None:
        self.built.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()


def run_trial(
    target: Any,
    config: Any,
    *,
    device: str = "cpu",
    warmup: int = 3,
    steps: int = 10,
    check_steps: int = 5,
    seed: int = 0,
) -> dict[str, Any]:
    """Time ``steps`` training steps of ``config`` after ``warmup`` untimed ones.

    Returns the per-step times, their median and spread, samples/s, peak memory, the
    loss after ``check_steps`` steps (same seed, same data as every other trial of the
    same batch size) and, with fp16, the steps GradScaler skipped. Compile time is the
    warm-up time above the steady step time.
    """
    import torch

    torch.manual_seed(seed)
    dev = torch.device(device)
    stepper = _Stepper(target, config, dev, compile_model=True)
    if stepper.cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    times: list[float] = []
    losses: list[float] = []
    for _ in range(warmup + steps):
        t0 = time.perf_counter()
        losses.append(stepper.step(config.batch_size))
        times.append(time.perf_counter() - t0)
    timed = times[warmup:]
    median = statistics.median(timed)
    q = statistics.quantiles(timed, n=4, method="inclusive") if len(timed) >= 2 else [median] * 3
    flops = target.flops_per_sample(config) if hasattr(target, "flops_per_sample") else None
    result: dict[str, Any] = {
        "ok": True,
        "warmup_times_s": [round(t, 6) for t in times[:warmup]],
        "step_times_s": [round(t, 6) for t in timed],
        "median_s": median,
        "p25_s": q[0],
        "p75_s": q[2],
        "min_s": min(timed),
        "max_s": max(timed),
        "samples_per_s": config.batch_size / median,
        "losses": losses,
        "check_loss": losses[min(check_steps, len(losses)) - 1],
        "overflow_steps": stepper.overflow_steps,
        "flops_per_sample": float(flops) if flops else None,
        "uses_loader": stepper.loader is not None,
    }
    if config.compile:
        result["compile_s"] = sum(max(0.0, t - median) for t in times[:warmup])
    if stepper.cuda:
        result["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(dev))
        result["memory_kind"] = "cuda max allocated"
    else:
        result["peak_memory_bytes"] = _max_rss_bytes()
        result["memory_kind"] = "max RSS"
    return result


def search_batch(
    target: Any,
    config: Any,
    *,
    device: str = "cpu",
    start: int = 1,
    limit: int = 4096,
    multiple: int = 1,
    headroom: float = 0.1,
    seed: int = 0,
) -> dict[str, Any]:
    """The largest batch of ``config`` that fits: doubling, then bisection (eager mode).

    A probe runs two optimizer steps (the second one has the optimizer state allocated).
    On CUDA it also fails when the peak reserved memory leaves less than ``headroom`` of
    the device free; on a CPU the address-space limit of this process is the bound.
    """
    import torch

    from acceptrun.tune.search import find_max_batch

    torch.manual_seed(seed)
    dev = torch.device(device)
    stepper = _Stepper(target, config.replace(compile=None), dev, compile_model=False)
    stepper.loader = None  # batches of the probed size come from make_batch, not the loader
    total = torch.cuda.get_device_properties(dev).total_memory if stepper.cuda else None
    errors: dict[int, str] = {}

    def fits(batch_size: int) -> bool:
        if stepper.cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        try:
            for _ in range(2):
                stepper.step(batch_size)
        except Exception as exc:
            if not is_oom(exc):
                raise
            errors[batch_size] = _describe(exc)
            return False
        finally:
            stepper.free()
        if total is not None:
            peak = torch.cuda.max_memory_reserved(dev)
            if peak > (1.0 - headroom) * total:
                errors[batch_size] = f"peak {peak / 2**30:.1f} GiB leaves under {headroom:.0%} free"
                return False
        return True

    found = find_max_batch(fits, start=start, limit=limit, multiple=multiple)
    return {
        "ok": True,
        "max_batch": found.max_batch,
        "capped": found.capped,
        "probes": [[b, ok, errors.get(b)] for b, ok in found.probes],
    }


def probe_device(device: str | None) -> dict[str, Any]:
    """Which device a trial gets, its name and memory, and the torch version."""
    import torch

    name = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    info: dict[str, Any] = {"ok": True, "device": name, "torch": torch.__version__}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update(name=props.name, total_memory_bytes=int(props.total_memory),
                    capability=f"{props.major}.{props.minor}", count=torch.cuda.device_count())  # fmt: skip
    else:
        import platform

        info.update(
            name=platform.processor() or platform.machine(), threads=torch.get_num_threads()
        )
    return info


# ---- the child's entry point ----------------------------------------------------------------


def _run_job(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from acceptrun.tune.target import TuneConfig, load_target

    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    if job["mode"] == "probe":
        return probe_device(job.get("device"))
    target = load_target(job["target"])
    config = TuneConfig.from_dict(job["config"])
    if job.get("memory_limit"):
        # What torch imports lazily (dynamo, from the optimizers' constructors) and its
        # thread pool belong to the interpreter, not to the trial: load them before the cap.
        import torch._dynamo
        import torch.utils.checkpoint

        torch.ones(256, 256) @ torch.ones(256, 256)
        limit_address_space(int(job["memory_limit"]))
    if job["mode"] == "search":
        s = job.get("search", {})
        return search_batch(
            target, config, device=job["device"], start=int(s.get("start", 1)),
            limit=int(s.get("limit", 4096)), multiple=int(s.get("multiple", 1)),
            headroom=float(s.get("headroom", 0.1)), seed=int(job.get("seed", 0)),
        )  # fmt: skip
    return run_trial(
        target, config, device=job["device"], warmup=int(job.get("warmup", 3)),
        steps=int(job.get("steps", 10)), check_steps=int(job.get("check_steps", 5)),
        seed=int(job.get("seed", 0)),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m acceptrun.tune.trial JOB.json RESULT.json", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        job = json.load(f)
    try:
        result = _run_job(job)
    except BaseException as exc:  # the parent reads the reason from the result file
        traceback.print_exc()
        result = {"ok": False, "oom": is_oom(exc), "error": _describe(exc)}
    from acceptrun._util.durable import write_json_atomic

    write_json_atomic(args[1], result)
    sys.stdout.flush()
    # Skip interpreter teardown: compile worker pools and CUDA contexts can take seconds
    # to unwind, and the result is already on disk.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
