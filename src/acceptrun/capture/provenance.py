"""Capture and diff the environment fingerprint of a run (``provenance.json``).

A run is repeatable only if the next engineer can rebuild what it ran on: OS and kernel,
CPU, memory, the workload's Python and packages, the code commit and uncommitted diff,
torch with its CUDA/cuDNN/NCCL, the GPUs and driver, and the environment variables that
steer them. :func:`capture` records each as a *part*; a part that cannot be read (no git,
no NVML, no torch, a timeout) becomes ``{"absent": true, "reason": "..."}`` instead of an
error, because a missing GPU library must not stop the record of everything else.

Two rules shape the code:

- torch is never imported here. The supervisor must start fast and may run without torch,
  and the facts that matter are those of the *workload's* interpreter, so they come from
  :mod:`acceptrun.capture._probe` run as a subprocess with that interpreter.
- secrets never reach the record: environment values whose name looks secret, and user
  info in URLs (``https://user:token@host``), are replaced by ``<redacted>``.

>>> prov = capture(diff_path="git.diff")
>>> print(format_provenance(prov))
"""

from __future__ import annotations

import contextlib
import datetime
import getpass
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acceptrun._util.durable import write_atomic
from acceptrun._util.git import git as _git
from acceptrun._util.hashing import hash_bytes, hash_stream
from acceptrun._util.redact import (  # the one place that says what a secret is
    REDACTED,
    is_secret_name,
    redact_text,
    redact_url,
    secret_values,
)
from acceptrun.capture import _probe
from acceptrun.errors import GitError, UserError

__all__ = [
    "Change",
    "capture",
    "device_smoke",
    "diff",
    "format_diff",
    "format_provenance",
    "redact_url",
]

SCHEMA = 1
PROBE = Path(__file__).with_name("_probe.py")
ENV_CACHE_DIR = "ACCEPTRUN_CACHE_DIR"
ENV_PROBE_CACHE = "ACCEPTRUN_PROBE_CACHE"  # "0" probes afresh every time
# Seconds for the python/packages/torch probe. torch's import takes 1 to 4 s on an idle
# machine, but over 60 s was measured on a 2-core machine at load 20; a probe that gives
# up records torch as absent, so the limit is generous (a cached probe takes ~50 ms).
PROBE_TIMEOUT = 180.0
ENV_PROBE_TIMEOUT = "ACCEPTRUN_PROBE_TIMEOUT"


def probe_timeout() -> float:
    """``$ACCEPTRUN_PROBE_TIMEOUT`` seconds when set to a positive number, else PROBE_TIMEOUT."""
    raw = os.environ.get(ENV_PROBE_TIMEOUT, "").strip()
    if not raw:
        return PROBE_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UserError(
            f"{ENV_PROBE_TIMEOUT} is {raw!r}; set it to a number of seconds above 0 "
            f"(default {PROBE_TIMEOUT:g}) or unset it"
        )
    return value


PARTS = ("os", "host", "cpu", "memory", "python", "packages", "git", "torch", "gpus", "env")
ENV_PREFIXES = (
    "CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "OMP_", "MKL_", "SLURM_", "HF_", "TRANSFORMERS_",
    "ACCEPTRUN_",
)  # fmt: skip
ENV_NAMES = frozenset(
    {"PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "HOSTNAME"}
)
# scheme://userinfo@ -> the userinfo goes, whether "user:password" or a bare token


def _is_absent(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("absent") is True


def _guard(name: str, read: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one part's reader; any exception becomes an absent part, never a crash."""
    try:
        return read()
    except Exception as exc:
        return _probe.absent(f"could not read {name} ({_probe.describe(exc)})")


# --- parts read in this process ---------------------------------------------------------


def acceptrun_checkout() -> Path | None:
    """The source checkout this acceptrun runs from (``<root>/src/acceptrun``), else None."""
    here = Path(__file__).resolve().parents[1]  # the acceptrun package
    root = here.parents[1]
    return root if here.parent.name == "src" and (root / "pyproject.toml").is_file() else None


def _acceptrun_part() -> dict[str, Any]:
    """This acceptrun: its version, and whether it runs from a checkout or an install."""
    from acceptrun._version import __version__

    return {
        "version": __version__,
        "from": "installed" if acceptrun_checkout() is None else "checkout",
        "path": str(Path(__file__).resolve().parents[1]),
    }


def _os_part() -> dict[str, Any]:
    release = platform.release()
    with contextlib.suppress(OSError, AttributeError):
        # Linux: the distribution ("Ubuntu 22.04.4 LTS") says more than the kernel release
        release = platform.freedesktop_os_release().get("PRETTY_NAME", release)
    return {
        "system": platform.system(),
        "release": release,
        "version": platform.version(),
        "platform": platform.platform(),
        "kernel": platform.uname().release,
    }


def _host_part() -> dict[str, Any]:
    try:
        user: str | None = getpass.getuser()
    except (OSError, KeyError):  # no USER/LOGNAME and a uid without a passwd entry
        user = None
    return {"hostname": socket.gethostname(), "user": user}


def _cpu_part() -> dict[str, Any]:
    import psutil

    model = platform.processor() or None
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model"):  # x86 / Arm boards
                model = value.strip()
                break
    return {
        "model": model,
        "arch": platform.machine(),
        "count_logical": os.cpu_count(),
        "count_physical": psutil.cpu_count(logical=False),
    }


def _memory_part() -> dict[str, Any]:
    import psutil

    return {"total_bytes": int(psutil.virtual_memory().total)}


def _gpus_part() -> dict[str, Any]:
    """GPUs and driver from NVML. NVML sees every GPU, whatever CUDA_VISIBLE_DEVICES says."""
    try:
        import pynvml
    except ImportError as exc:
        return _probe.absent(f"nvidia-ml-py is not installed ({_probe.describe(exc)})")
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return _probe.absent(f"nvidia-ml-py: {exc}")
    try:
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())  # 12040 means CUDA 12.4
        devices = []
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            devices.append(
                {
                    "index": index,
                    "name": _text(pynvml.nvmlDeviceGetName(handle)),
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                    "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                }
            )
        return {
            "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}",
            "count": len(devices),
            "devices": devices,
        }
    except Exception as exc:
        return _probe.absent(f"nvidia-ml-py: {exc}")
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    """NVML strings are bytes in older nvidia-ml-py releases and str in newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _env_part(env: Mapping[str, str]) -> dict[str, Any]:
    chosen = {}
    for name in sorted(env):
        if not (name in ENV_NAMES or name.startswith(ENV_PREFIXES)):
            continue
        secret = is_secret_name(name)
        chosen[name] = REDACTED if secret else redact_text(str(env[name]), secret_values(env))
    return chosen


def _packages_part(names: Mapping[str, str]) -> dict[str, Any]:
    lines = "\n".join(f"{name}=={version}" for name, version in sorted(names.items()))
    return {"count": len(names), "hash": hash_bytes(lines.encode()), "list": dict(names)}


# --- git ----------------------------------------------------------------------------------


def _excluded(root: Path, paths: Sequence[Path]) -> list[str]:
    """``:(top,exclude)`` pathspecs for ``paths`` inside the checkout at ``root``."""
    specs = []
    for path in paths:
        try:
            rel = Path(path).resolve().relative_to(root.resolve())
        except (OSError, ValueError):
            continue  # outside the checkout: git does not see it anyway
        if rel.parts:
            specs.append(f":(top,exclude){rel.as_posix()}")
    return specs


def _git_part(
    cwd: Path | None, diff_path: Path | None, exclude: Sequence[Path] = ()
) -> dict[str, Any]:
    try:
        cwd = cwd or Path.cwd()
    except OSError as exc:  # the current directory was deleted under us
        return _probe.absent(f"no current directory ({exc.strerror})")
    if not cwd.is_dir():
        return _probe.absent(f"working directory {cwd} does not exist")
    try:
        root = Path(_git(cwd, "rev-parse", "--show-toplevel"))
    except GitError as exc:
        return _probe.absent(str(exc))
    try:
        commit = _git(root, "rev-parse", "--verify", "-q", "HEAD", check=False) or None
        branch = _git(root, "symbolic-ref", "--short", "-q", "HEAD", check=False) or None
        remote = _git(root, "remote", "get-url", "origin", check=False) or None
        # acceptrun's own files (the workspace and its runs) are never the code's changes,
        # even in a workspace whose .gitignore is missing (read-only, or made by hand).
        own = ("--", *_excluded(root, exclude)) if exclude else ()
        dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=normal", *own))
        # A repository without commits yet: diff against the empty tree instead of HEAD.
        base = commit or _git(root, "hash-object", "-t", "tree", "/dev/null")
        untracked = _git(root, "ls-files", "--others", "--exclude-standard", "-z", *own)
        with tempfile.TemporaryFile() as tmp:
            names = [n for n in untracked.split("\0") if n]
            if names:  # git apply skips text before the first "diff --git" line
                note = "# untracked files, not in this diff:\n" + "".join(
                    f"#   {n}\n" for n in names
                )
                tmp.write(note.encode(errors="surrogateescape"))
                tmp.flush()
            # git writes straight into the file, so a diff of GiB never sits in memory. The
            # flags undo user config (textconv, prefixes, relative) that would stop the
            # patch from applying with `git apply` on a clean checkout.
            flags = ("--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--no-relative")
            prefixes = ("--src-prefix=a/", "--dst-prefix=b/")
            _git(root, "diff", *flags, *prefixes, base, "--", *own[1:], stdout=tmp)
            tmp.seek(0)
            diff_hash, diff_bytes = hash_stream(iter(lambda: tmp.read(1 << 20), b""))
            if diff_path is not None:
                tmp.seek(0)
                write_atomic(diff_path, lambda out: shutil.copyfileobj(tmp, out))
    except GitError as exc:
        return _probe.absent(str(exc))
    return {
        "root": str(root),
        "commit": commit,
        "branch": branch,
        "remote": redact_url(remote) if remote else None,
        "dirty": dirty,
        "diff_hash": diff_hash,
        "diff_bytes": diff_bytes,
        "diff_file": diff_path.name if diff_path is not None else None,
    }


# --- the probe subprocess ---------------------------------------------------------------


def cache_dir() -> Path:
    """Where acceptrun keeps what it may reuse between runs on this machine.

    ``$ACCEPTRUN_CACHE_DIR``, else ``$XDG_CACHE_HOME/acceptrun``, else
    ``~/.cache/acceptrun``. Nothing in it is a record: deleting it only costs time.
    """
    explicit = os.environ.get(ENV_CACHE_DIR)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "acceptrun" if xdg else Path.home() / ".cache" / "acceptrun"


def _probe_args() -> list[str]:
    """``--cache DIR`` unless ACCEPTRUN_PROBE_CACHE=0 asks for a fresh probe every time."""
    if os.environ.get(ENV_PROBE_CACHE, "1").strip().lower() in ("0", "false", "no", "off"):
        return []
    return ["--cache", str(cache_dir() / "probe")]


def _start_probe(
    python: str, args: list[str], env: Mapping[str, str] | None, cwd: Path | None = None
) -> subprocess.Popen[bytes] | str:
    """Start ``_probe.py`` under ``python``; returns the process, or why it did not start.

    ``cwd``: the job's working directory, where a relative PYTHONPATH entry points (the
    restart's check, capture/reverify.py, lists the packages from there too).
    """
    try:
        return subprocess.Popen(
            [python, str(PROBE), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=None if env is None else {**os.environ, **env},
            cwd=cwd if cwd is not None and cwd.is_dir() else None,
        )
    except OSError as exc:
        return f"could not start interpreter {python!r} ({exc.strerror or exc})"


def _finish_probe(
    proc: subprocess.Popen[bytes] | str, python: str, timeout: float
) -> dict[str, Any] | str:
    """The probe's JSON answer, or a reason string when it failed or ran out of time."""
    if isinstance(proc, str):
        return proc
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return f"probe under {python} timed out after {timeout:g} s"
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        status = f"exit status {proc.returncode}"
        if proc.returncode < 0:  # a crash in a C extension (CUDA, a broken wheel) lands here
            with contextlib.suppress(ValueError):
                status = f"killed by {signal.Signals(-proc.returncode).name}"
        return f"probe under {python} failed ({status}): {lines[-1] if lines else 'no output'}"
    try:
        answer = json.loads(out)
    except json.JSONDecodeError:
        return f"probe under {python} printed no JSON answer: {out[:200]!r}"
    if not isinstance(answer, dict):
        return f"probe under {python} answered {type(answer).__name__}, not an object"
    return answer


def _probe_part(answer: dict[str, Any] | str, name: str) -> dict[str, Any]:
    if isinstance(answer, str):
        return _probe.absent(answer)
    part = answer.get(name)
    return part if isinstance(part, dict) else _probe.absent(f"probe answer has no {name!r} part")


# --- public API ---------------------------------------------------------------------------


def capture(
    *,
    python: str | None = None,
    cwd: str | Path | None = None,
    diff_path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    exclude: Sequence[str | Path] = (),
) -> dict[str, Any]:
    """The environment fingerprint of a run, as a JSON-serialisable dict.

    ``python`` is the workload's interpreter (default: this one, whose python and packages
    parts are then read in-process). The torch part, and for another interpreter also
    python and packages, come from :mod:`acceptrun.capture._probe` run under it, with
    ``os.environ`` updated by ``env`` so CUDA_VISIBLE_DEVICES and the like apply.
    ``cwd`` is where git looks for the code (default: the current directory).
    ``diff_path`` receives the uncommitted diff, atomically; an error writing it is
    raised, since the caller asked for that file and the record beside it is at risk.
    ``env`` is the workload's environment (default ``os.environ``); a chosen, redacted
    subset is recorded. ``exclude`` names directories that are never the code's changes
    (the acceptrun workspace): left out of ``dirty``, the untracked list and the diff.
    Takes about as long as importing torch (~1 s on a warm disk), which overlaps with
    reading the other parts; a probe slower than ``$ACCEPTRUN_PROBE_TIMEOUT`` (default
    180 s) records its parts as absent with the reason.

    >>> capture(diff_path="run/git.diff")["git"]["dirty"]
    False
    """
    timeout = probe_timeout()
    interpreter = python or sys.executable
    workdir = Path(cwd) if cwd is not None else None
    probe = (
        _start_probe(interpreter, _probe_args(), env, workdir)
        if interpreter
        else "sys.executable is empty"
    )
    cache: Any = None
    try:
        started = time.monotonic()
        parts = _local_parts(python, cwd, diff_path, env, exclude)
        remaining = max(1.0, timeout - (time.monotonic() - started))
        answer = _finish_probe(probe, interpreter, remaining)
        if isinstance(answer, dict):
            cache = answer.pop("cache", None)
        parts.update(_probed_parts(answer, python is not None))
    finally:  # an error writing the diff must not leave the probe running
        if isinstance(probe, subprocess.Popen) and probe.poll() is None:
            probe.kill()
            probe.wait()
    return _fingerprint(parts, cache)


def _local_parts(
    python: str | None,
    cwd: str | Path | None,
    diff_path: str | Path | None,
    env: Mapping[str, str] | None,
    exclude: Sequence[str | Path],
) -> dict[str, dict[str, Any]]:
    """The parts read in this process while the probe runs (see :func:`capture`)."""
    parts: dict[str, dict[str, Any]] = {
        "os": _guard("os", _os_part),
        "host": _guard("host", _host_part),
        "cpu": _guard("cpu", _cpu_part),
        "memory": _guard("memory", _memory_part),
    }
    if python is None:  # this interpreter runs the workload: read it here, cheaply
        parts["python"] = _guard("python", _probe.python_info)
        parts["packages"] = _guard("packages", lambda: _packages_part(_probe.package_list()))
    target = Path(diff_path) if diff_path is not None else None
    parts["git"] = _git_part(
        Path(cwd) if cwd is not None else None, target, [Path(p) for p in exclude]
    )
    parts["gpus"] = _guard("gpus", _gpus_part)
    parts["env"] = _guard("env", lambda: _env_part(os.environ if env is None else env))
    return parts


def _probed_parts(answer: dict[str, Any] | str, other_python: bool) -> dict[str, dict[str, Any]]:
    """The parts the probe read: torch, and python and packages for ``other_python``."""
    parts: dict[str, dict[str, Any]] = {}
    if other_python:
        parts["python"] = _probe_part(answer, "python")
        packages = _probe_part(answer, "packages")
        if not _is_absent(packages):
            packages = _guard("packages", lambda: _packages_part(packages["list"]))
        parts["packages"] = packages
    parts["torch"] = _probe_part(answer, "torch")
    return parts


def _fingerprint(parts: dict[str, dict[str, Any]], cache: Any) -> dict[str, Any]:
    """The provenance document: the parts in :data:`PARTS` order, their hashes, and
    where the probed facts came from (``cache``, the probe's answer about its cache)."""
    ordered = {name: parts[name] for name in PARTS}
    hashes = {name: hash_bytes(_canonical(part)) for name, part in ordered.items()}
    hashes["all"] = hash_bytes(_canonical(hashes))
    now = datetime.datetime.now(datetime.UTC)
    return {
        "schema": SCHEMA,
        "captured_at": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        **ordered,
        "hashes": hashes,
        # the acceptrun that captured it, and where it ran from; not part of any hash
        "acceptrun": _acceptrun_part(),
        # whether the python/packages/torch facts were read now or reused from the probe
        # cache (cache_dir()), and when they were read; not part of any hash
        "probe": {"cached": False}
        if not isinstance(cache, dict)
        else {
            "cached": bool(cache.get("hit")),
            **{k: cache[k] for k in ("key", "captured_at", "reason", "error") if k in cache},
        },
    }


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def device_smoke(*, python: str | None = None, timeout: float = 120.0) -> dict[str, Any]:
    """A short GPU check under the workload's interpreter; never raises.

    On each device torch sees: bf16 and fp32 4096x4096 matmuls (TFLOP/s, result must be
    finite) and a 256 MiB pinned host-to-device copy (GB/s). ``timeout`` is in seconds.

    >>> device_smoke()
    {'ran': False, 'ok': True, 'reason': 'no CUDA device visible to torch'}
    """
    interpreter = python or sys.executable
    started = time.monotonic()
    answer = _finish_probe(_start_probe(interpreter, ["--smoke"], None), interpreter, timeout)
    if isinstance(answer, str):
        return {"ran": True, "ok": False, "error": f"device smoke test: {answer}"}
    if answer.get("ran"):
        answer["seconds"] = round(time.monotonic() - started, 3)  # interpreter start included
    return answer


@dataclass(frozen=True)
class Change:
    """One difference between two provenance records; ``None`` where a side lacks it."""

    path: str
    """Where, e.g. ``"packages.list.torch"`` or ``"gpus.devices[0].name"``."""
    a: Any
    """The value in the first record."""
    b: Any
    """The value in the second record."""


_MISSING: Any = object()
_IGNORED = frozenset({"captured_at", "hashes", "probe"})


def diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Change]:
    """Every leaf that differs between two captures, in sorted key order.

    ``captured_at``, ``hashes`` and ``probe`` are skipped (they differ on every capture,
    only summarise what is compared anyway, or say how the facts were read). Packages appear one by one, so an added package
    is ``Change("packages.list.numpy", None, "2.0.1")``.
    """
    changes: list[Change] = []
    keys = sorted((set(a) | set(b)) - _IGNORED)
    for key in keys:
        _walk(key, a.get(key, _MISSING), b.get(key, _MISSING), changes)
    return changes


def _walk(path: str, a: Any, b: Any, out: list[Change]) -> None:
    # A side missing under a dict or list walks as an empty one, so each of its leaves
    # shows as a change of its own (an added package, a GPU that went away).
    if _container_pair(a, b, Mapping):
        left: Mapping[Any, Any] = {} if a is _MISSING else a
        right: Mapping[Any, Any] = {} if b is _MISSING else b
        for key in sorted(set(left) | set(right), key=str):
            _walk(f"{path}.{key}", left.get(key, _MISSING), right.get(key, _MISSING), out)
    elif _container_pair(a, b, list):
        items_a: list[Any] = [] if a is _MISSING else a
        items_b: list[Any] = [] if b is _MISSING else b
        for i in range(max(len(items_a), len(items_b))):
            x = items_a[i] if i < len(items_a) else _MISSING
            y = items_b[i] if i < len(items_b) else _MISSING
            _walk(f"{path}[{i}]", x, y, out)
    elif a != b:
        out.append(Change(path, None if a is _MISSING else a, None if b is _MISSING else b))


def _container_pair(a: Any, b: Any, kind: type) -> bool:
    """Both sides are ``kind`` or missing (never both: diff() only walks present keys)."""
    return all(v is _MISSING or isinstance(v, kind) for v in (a, b))


def format_diff(changes: list[Change]) -> str:
    """One line per change, ``path: a -> b``; ``"no differences"`` when there are none."""
    if not changes:
        return "no differences"
    return "\n".join(f"{c.path}: {_show(c.a)} -> {_show(c.b)}" for c in changes)


def _show(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def format_provenance(prov: Mapping[str, Any]) -> str:
    """A short, aligned summary of a capture for ``acceptrun env``; tolerates old records."""
    rows: list[tuple[str, Callable[[Mapping[str, Any]], str]]] = [
        ("os", lambda p: f"{p['system']} {p['release']}, kernel {p['kernel']}"),
        ("host", lambda p: f"{p['hostname']} (user {p['user']})"),
        ("cpu", _fmt_cpu),
        ("memory", lambda p: f"{p['total_bytes'] / 2**30:.1f} GiB"),
        ("python", lambda p: f"{p['implementation']} {p['version']}  {p['executable']}"),
        ("packages", lambda p: f"{p['count']} installed, {p['hash']}"),
        ("git", _fmt_git),
        ("torch", _fmt_torch),
        ("gpus", _fmt_gpus),
        ("acceptrun", lambda p: f"{p['version']} ({p['from']})  {p['path']}"),
    ]
    lines = []
    for key, render in rows:
        part = prov.get(key)
        if not isinstance(part, Mapping):
            text = "absent (not recorded)"
        elif _is_absent(part):
            text = f"absent ({part.get('reason', 'no reason recorded')})"
        else:
            try:
                text = render(part)
            except (KeyError, TypeError, ValueError) as exc:
                text = f"unreadable ({_probe.describe(exc)})"
        lines.append(f"{key:<9} {text}")
    probe = prov.get("probe")
    if isinstance(probe, Mapping) and probe.get("cached"):
        lines.append(
            f"{'probe':<9} python, packages and torch as read at {probe.get('captured_at')} "
            "(unchanged since; ACCEPTRUN_PROBE_CACHE=0 reads them afresh)"
        )
    return "\n".join(lines)


def _fmt_cpu(p: Mapping[str, Any]) -> str:
    return (
        f"{p['model'] or 'unknown model'} ({p['arch']}), "
        f"{p['count_logical']} logical / {p['count_physical']} physical cores"
    )


def _fmt_git(p: Mapping[str, Any]) -> str:
    commit = (p["commit"] or "no commits")[:12]
    where = f"on {p['branch']}" if p["branch"] else "detached"
    state = f"dirty, diff {p['diff_bytes']} bytes {p['diff_hash']}" if p["dirty"] else "clean"
    return f"{commit} {where}, {state}  {p['root']}"


def _fmt_torch(p: Mapping[str, Any]) -> str:
    gpus = f"{p['device_count']} CUDA device(s)" if p["cuda_available"] else "CUDA not available"
    built = "  ".join(f"{lib} {p[key] or 'none'}" for lib, key in _TORCH_LIBS)
    return f"{p['version']}  {built}  ({gpus})"


_TORCH_LIBS = (("CUDA", "cuda"), ("cuDNN", "cudnn"), ("NCCL", "nccl"))


def _fmt_gpus(p: Mapping[str, Any]) -> str:
    names = ", ".join(
        f"{d['index']}: {d['name']} {d['memory_total_bytes'] / 2**30:.0f} GiB" for d in p["devices"]
    )
    return f"{p['count']} (driver {p['driver']}, CUDA {p['cuda_driver']})  {names}".rstrip()
