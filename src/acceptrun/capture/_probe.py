"""Probe the interpreter a workload will run under; prints one JSON object on stdout.

Run as ``[python, path/to/_probe.py]`` (python, packages and torch facts) or
``[python, path/to/_probe.py, --smoke]`` (a short GPU smoke test). It is a standalone
script on purpose: the workload's interpreter may be another venv or Python version
without acceptrun in it, so this file uses the standard library only (Python 3.8+) and
torch when that interpreter has it. It is also where torch gets imported at all, so the
supervisor never pays torch's ~1 s import or needs torch installed.

Each part that cannot be read is ``{"absent": true, "reason": "..."}``; the script exits 0
unless it cannot even write its answer.
"""

from __future__ import annotations

import os
import sys

# Running a file puts its folder first on sys.path. That folder holds acceptrun's own
# modules, and one named like a stdlib module (say queue.py) would be imported by torch in
# place of the stdlib one. Drop it before importing anything not already loaded at startup.
if (
    __name__ == "__main__"
    and sys.path
    and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__))
):
    del sys.path[0]

import contextlib
import json
import platform
import re
import time
from collections.abc import Callable
from typing import Any

MATMUL_N = 4096  # square matrix side for the smoke matmul: 137 GFLOP per product
MATMUL_ITERS = 10  # timed products per dtype, after 2 warm-ups
H2D_BYTES = 256 * 1024 * 1024  # pinned host buffer copied to the device, bytes
H2D_ITERS = 5  # timed host-to-device copies


def absent(reason: str) -> dict[str, Any]:
    """The marker for a part that could not be read, with the reason why."""
    return {"absent": True, "reason": reason}


def describe(exc: BaseException) -> str:
    """``"Type: message"`` of an exception, for a reason string."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def python_info() -> dict[str, Any]:
    """Version, implementation and path of the running interpreter."""
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
    }


def normalize_name(name: str) -> str:
    """PEP 503 name: ``Foo_Bar.baz`` -> ``foo-bar-baz``, so the same project always matches."""
    return re.sub(r"[-_.]+", "-", name).lower()


def package_list() -> dict[str, str]:
    """``{normalised name: version}`` of every distribution the interpreter can import.

    When a name is installed twice the first on sys.path wins, as it does for ``import``.
    """
    from importlib import metadata

    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue  # a broken .dist-info without a name; nothing to record
        found.setdefault(normalize_name(name), dist.version or "")
    return dict(sorted(found.items()))


def _import_torch() -> tuple[Any, str | None]:
    """``(torch, None)``, or ``(None, reason)`` when this interpreter cannot import it."""
    try:
        import torch
    except ImportError as exc:
        return None, f"torch is not installed for {sys.executable} ({describe(exc)})"
    except Exception as exc:  # a broken install (missing CUDA library) raises OSError & co.
        return None, f"torch failed to import in {sys.executable} ({describe(exc)})"
    return torch, None


def cudnn_version(raw: int | None) -> str | None:
    """cuDNN's integer version as text: 8907 -> ``"8.9.7"``, 90100 -> ``"9.1.0"``."""
    if not raw:
        return None
    if raw >= 10000:  # cuDNN 9 and later encode major*10000 + minor*100 + patch
        return f"{raw // 10000}.{raw % 10000 // 100}.{raw % 100}"
    return f"{raw // 1000}.{raw % 1000 // 100}.{raw % 100}"


def torch_info() -> dict[str, Any]:
    """torch's version and the CUDA, cuDNN and NCCL it was built with (None on CPU builds)."""
    torch, reason = _import_torch()
    if torch is None:
        return absent(reason or "torch is not importable")
    try:
        cudnn = cudnn_version(torch.backends.cudnn.version())
    except Exception:
        cudnn = None
    try:
        raw = torch.cuda.nccl.version()
        nccl = ".".join(str(p) for p in raw) if isinstance(raw, tuple) else str(raw)
    except Exception:  # CPU builds have no NCCL binding at all (AttributeError)
        nccl = None
    try:
        available = bool(torch.cuda.is_available())
        count = int(torch.cuda.device_count()) if available else 0
    except Exception:
        available, count = False, 0
    return {
        "version": str(torch.__version__),
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "nccl": nccl,
        "cuda_available": available,
        "device_count": count,
    }


def environment() -> dict[str, Any]:
    """The default answer: python, packages and torch parts of this interpreter."""
    try:
        packages: dict[str, Any] = {"list": package_list()}
    except Exception as exc:
        packages = absent(f"could not list packages ({describe(exc)})")
    return {"python": python_info(), "packages": packages, "torch": torch_info()}


def _timed(fn: Callable[[], object], iters: int, torch: Any) -> float:
    """Seconds per call of ``fn``, timed across ``iters`` calls with a device sync."""
    torch.cuda.synchronize()  # a CPU-GPU sync point: queued work must not count
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def matmul_tflops(torch: Any, device: Any, dtype: Any) -> float:
    """TFLOP/s of a square matmul on ``device``; raises if the product is not finite."""
    a = torch.randn(MATMUL_N, MATMUL_N, device=device, dtype=dtype)
    b = torch.randn(MATMUL_N, MATMUL_N, device=device, dtype=dtype)
    out = torch.matmul(a, b)
    torch.matmul(a, b, out=out)  # two warm-ups: the first call picks and loads the kernel
    seconds = _timed(lambda: torch.matmul(a, b, out=out), MATMUL_ITERS, torch)
    if not bool(torch.isfinite(out).all().item()):
        raise RuntimeError(f"{dtype} matmul produced non-finite values")
    return round(2.0 * MATMUL_N**3 / seconds / 1e12, 2)


def h2d_gb_s(torch: Any, device: Any) -> float:
    """GB/s of a pinned host-to-device copy; raises if the bytes arrive wrong."""
    host = torch.empty(H2D_BYTES, dtype=torch.uint8, pin_memory=True).fill_(7)
    dev = torch.empty(H2D_BYTES, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=True)  # warm-up: maps the pinned pages for the DMA engine
    seconds = _timed(lambda: dev.copy_(host, non_blocking=True), H2D_ITERS, torch)
    if int(dev[-1024:].sum().item()) != 7 * 1024:
        raise RuntimeError("host-to-device copy delivered wrong bytes")
    return round(H2D_BYTES / seconds / 1e9, 2)


def smoke_device(torch: Any, index: int) -> dict[str, Any]:
    """Allocate, multiply and copy on one device; any failure lands in ``error``."""
    result: dict[str, Any] = {
        "index": index,
        "name": None,
        "matmul_bf16_tflops": None,
        "matmul_fp32_tflops": None,
        "h2d_gb_s": None,
        "error": None,
    }
    try:
        device = torch.device("cuda", index)
        result["name"] = torch.cuda.get_device_name(index)
        result["matmul_bf16_tflops"] = matmul_tflops(torch, device, torch.bfloat16)
        result["matmul_fp32_tflops"] = matmul_tflops(torch, device, torch.float32)
        result["h2d_gb_s"] = h2d_gb_s(torch, device)
    except Exception as exc:
        result["error"] = describe(exc)
    finally:
        # a device that failed may refuse this too; its error is already recorded
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()
    return result


def smoke() -> dict[str, Any]:
    """The ``--smoke`` answer: run :func:`smoke_device` on every device torch can see."""
    torch, reason = _import_torch()
    if torch is None:
        return {"ran": False, "ok": True, "reason": reason}
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return {"ran": False, "ok": True, "reason": "no CUDA device visible to torch"}
    start = time.perf_counter()
    devices = [smoke_device(torch, i) for i in range(torch.cuda.device_count())]
    return {
        "ran": True,
        "ok": all(d["error"] is None for d in devices),
        "devices": devices,
        "seconds": round(time.perf_counter() - start, 3),
    }


def main(argv: list[str]) -> int:
    # Libraries (torch, CUDA) may print to stdout, even from C; point fd 1 at stderr so
    # the one JSON answer is the only thing on the real stdout.
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    answer = smoke() if "--smoke" in argv else environment()
    sys.stdout.flush()
    with os.fdopen(answer_fd, "w") as out:
        out.write(json.dumps(answer, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
