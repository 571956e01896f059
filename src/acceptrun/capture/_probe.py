"""Probe the interpreter a workload will run under; prints one JSON object on stdout.

Run as ``[python, path/to/_probe.py]`` (python, packages and torch facts) or
``[python, path/to/_probe.py, --smoke]`` (a short GPU smoke test). With ``--cache DIR`` the
facts answer is kept in DIR under a key of what it depends on (see :func:`fingerprint`) and
read back while that key holds, so an unchanged environment is not re-probed (torch's
import is most of a run's start-up); machines with a GPU device node are always probed. It is a standalone
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

# The probe reads the environment and must not change it: importing torch (or a package
# on sys.path) with bytecode writing on can create a __pycache__ folder in it, which
# changes that folder's time, a part of the cache key: the answer just kept would then
# never be read back (seen where torch was installed without its .pyc files).
if __name__ == "__main__":
    sys.dont_write_bytecode = True

import contextlib
import datetime
import hashlib
import json
import platform
import re
import tempfile
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


def _name_and_version(dist: Any) -> tuple[str | None, str | None]:
    """A distribution's ``Name`` and ``Version`` headers, read from its metadata's head alone.

    ``dist.metadata`` parses the whole file as an e-mail message, long description and
    all, and the list asked it twice per distribution (name, then version): 70 ms of every
    ``acceptrun run`` with 201 packages installed, 9 ms this way. The headers end at the
    first empty line.
    """
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    name = version = None
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if sep and key == "name" and name is None:
            name = value.strip()
        elif sep and key == "version" and version is None:
            version = value.strip()
    return name, version


def package_list(path: list[str] | None = None) -> dict[str, str]:
    """``{normalised name: version}`` of every distribution the interpreter can import.

    When a name is installed twice the first on sys.path wins, as it does for ``import``.
    ``path``: other folders to look in than ``sys.path``.
    """
    from importlib import metadata

    found: dict[str, str] = {}
    for dist in metadata.distributions(path=sys.path if path is None else path):
        name, version = _name_and_version(dist)
        if not name:
            continue  # a broken .dist-info without a name; nothing to record
        found.setdefault(normalize_name(name), version or "")
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


def environment_packages() -> dict[str, Any]:
    """The packages part: ``{"list": {name: version}}``, or absent with the reason."""
    try:
        return {"list": package_list()}
    except Exception as exc:
        return absent(f"could not list packages ({describe(exc)})")


def environment() -> dict[str, Any]:
    """The default answer: python, packages and torch parts of this interpreter."""
    return {"python": python_info(), "packages": environment_packages(), "torch": torch_info()}


# What the facts answer depends on besides sys.path's contents: variables that change what
# torch finds or loads, and device nodes whose presence means CUDA/ROCm state is live.
KEY_ENV = (
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH",
    "LD_PRELOAD", "PYTHONHOME",
)  # fmt: skip
DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")
CACHE_KEEP = 32  # answers kept in the cache directory, newest first


def _stat_key(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino]


def _metadata_keys(entry: str) -> list[Any]:
    """The metadata files of the distributions in one sys.path folder, with their stats.

    A folder's own time changes when an install adds or removes an entry; this also
    catches a distribution's metadata rewritten in place.
    """
    try:
        names = sorted(os.listdir(entry or "."))
    except OSError:
        return []
    keys: list[Any] = []
    for name in names:
        if name.endswith(".dist-info"):
            keys.append([name, _stat_key(os.path.join(entry, name, "METADATA"))])
        elif name.endswith(".egg-info"):
            folder = os.path.join(entry, name)
            info = os.path.join(folder, "PKG-INFO") if os.path.isdir(folder) else folder
            keys.append([name, _stat_key(info)])
    return keys


def fingerprint() -> dict[str, Any] | None:
    """What :func:`environment`'s answer depends on, read without importing torch.

    The interpreter (its version and binary), every sys.path entry's modification time and
    its distributions' metadata files (what :func:`package_list` reads), torch's location and build
    files, the variables in KEY_ENV, the boot and this script's own text. None when a GPU
    device node exists: CUDA's state (devices visible, a GPU fallen off the bus) is then
    read fresh every time.
    """
    if any(os.path.exists(node) for node in DEVICE_NODES):
        return None
    from importlib import util

    try:
        spec = util.find_spec("torch")  # locates the package without running it
    except (ImportError, ValueError):
        spec = None
    torch_dir = os.path.dirname(spec.origin) if spec is not None and spec.origin else None
    boot = None
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    with open(os.path.abspath(__file__), "rb") as f:
        own = hashlib.sha256(f.read()).hexdigest()
    executable = os.path.realpath(sys.executable)
    return {
        "version": sys.version,
        "executable": [sys.executable, executable, _stat_key(executable)],
        "path": [[entry, _stat_key(entry or "."), _metadata_keys(entry)] for entry in sys.path],
        "torch": None
        if torch_dir is None
        else [
            torch_dir,
            _stat_key(torch_dir),
            _stat_key(os.path.join(torch_dir, "version.py")),
            _stat_key(os.path.join(torch_dir, "lib")),
        ],
        "env": {name: os.environ.get(name) for name in KEY_ENV},
        "boot": boot,
        "probe": own,
    }


def cached_environment(cache_dir: str) -> dict[str, Any]:
    """:func:`environment`, read from ``cache_dir`` while its fingerprint holds.

    The answer carries ``cache``: whether it was a hit, the key, when the facts were read,
    and why the cache was not used or not written when that happened; a cache that cannot
    be used never stops the probe.
    """
    key_facts = fingerprint()
    if key_facts is None:
        answer = environment()
        answer["cache"] = {"hit": False, "reason": "a GPU device node exists: probed fresh"}
        return answer
    key = hashlib.sha256(json.dumps(key_facts, sort_keys=True).encode()).hexdigest()[:32]
    path = os.path.join(cache_dir, f"probe-{key}.json")
    # A standalone script (no acceptrun imports): the cache is bounded here, not by durable.
    with contextlib.suppress(OSError, ValueError, RecursionError, MemoryError):
        with open(path) as f:
            kept = json.load(f)
        if (
            isinstance(kept, dict)
            and kept.get("key") == key
            and isinstance(kept.get("answer"), dict)
        ):
            hit: dict[str, Any] = kept["answer"]
            hit["cache"] = {"hit": True, "key": key, "captured_at": kept.get("captured_at")}
            return hit
    answer = environment()
    utc = datetime.timezone.utc  # noqa: UP017 (this file runs on Python 3.8+)
    now = datetime.datetime.now(utc).isoformat(timespec="seconds")
    info: dict[str, Any] = {"hit": False, "key": key, "captured_at": now}
    try:
        os.makedirs(cache_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".probe-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump({"key": key, "captured_at": now, "answer": answer}, out)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _prune(cache_dir)
    except OSError as exc:
        info["error"] = f"could not keep the answer in {cache_dir} ({describe(exc)})"
    answer["cache"] = info
    return answer


def _prune(cache_dir: str) -> None:
    kept = []
    for name in os.listdir(cache_dir):
        if name.startswith("probe-") and name.endswith(".json"):
            with contextlib.suppress(OSError):
                kept.append((os.stat(os.path.join(cache_dir, name)).st_mtime_ns, name))
    for _, name in sorted(kept, reverse=True)[CACHE_KEEP:]:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(cache_dir, name))


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
    if "--smoke" in argv:
        answer = smoke()
    elif "--packages" in argv:  # a restart's check (capture/reverify.py): no torch, ~10 ms
        answer = {"packages": environment_packages()}
    elif "--cache" in argv and argv.index("--cache") + 1 < len(argv):
        answer = cached_environment(argv[argv.index("--cache") + 1])
    else:
        answer = environment()
    sys.stdout.flush()
    with os.fdopen(answer_fd, "w") as out:
        out.write(json.dumps(answer, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
