"""Checks before the first step: environment, resources, storage, device, data.

Two stages:

- :func:`check_static` runs before a run record exists and catches bad input (a command
  or working directory that does not exist, a missing data path or manifest). It raises
  :class:`~acceptrun.errors.PreflightError` and leaves nothing behind.
- :func:`run_preflight` runs inside the new record: it captures provenance, checks the
  spec's expectations and resources against it, smoke-tests storage and the GPU, and
  verifies the data against its manifest. Each check is timed and written to
  ``preflight.json``; any failure stops the run before launch.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.console import get_logger
from acceptrun.capture import data as datamod
from acceptrun.capture import provenance
from acceptrun.errors import PreflightError, SpecError
from acceptrun.record.workspace import RunRecord, now_iso
from acceptrun.spec.model import RunSpec, match_pattern

__all__ = [
    "Check",
    "Preflight",
    "check_backend",
    "check_static",
    "interpreter_source",
    "run_preflight",
    "storage_smoke",
    "workload_python",
]

_log = get_logger(__name__)  # each check's outcome, as `acceptrun run` shows it

SMOKE_BYTES = 8 * 1024 * 1024  # written, fsynced and read back per directory
_SHELL_LIST = set(";&|<>`\n")  # a list, pipeline or redirection: appended args land elsewhere
_SHELL_WORDS = {
    "cd",
    "exec",
    "export",
    "source",
    ".",
    "set",
    "env",
    "time",
    "nice",
    "nohup",
    "if",
    "for",
    "while",
    "(",
}


@dataclass(slots=True)
class Check:
    """One preflight check: what was checked, whether it passed, and the evidence."""

    name: str
    ok: bool
    message: str
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "message": self.message,
            "seconds": round(self.seconds, 4),
            "details": self.details,
        }


@dataclass(slots=True)
class Preflight:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


# ---- before the record ------------------------------------------------------------------


def _argv0(spec: RunSpec) -> str | None:
    """The program the command runs, or None when a shell line starts with a builtin."""
    if spec.shell:
        try:
            words = shlex.split(spec.command[2])
        except ValueError:
            return None
        words = [w for w in words if "=" not in w.split("/")[0]]  # skip VAR=value prefixes
        if not words or words[0] in _SHELL_WORDS:
            return None
        return words[0]
    return spec.command[0]


def _search_path(spec: RunSpec) -> str:
    return spec.env.get("PATH", os.environ.get("PATH", os.defpath))


def resolve_program(spec: RunSpec) -> str | None:
    """Absolute path of the program the command starts (None if it cannot be told)."""
    prog = _argv0(spec)
    if prog is None:
        return None
    if "/" in prog:
        # abspath, not resolve(): a venv's bin/python is a symlink to the base interpreter,
        # and resolving it would describe the base Python's packages instead of the venv's.
        path = Path(os.path.abspath(spec.workdir_path / prog))
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which(prog, path=_search_path(spec))


def workload_python(spec: RunSpec) -> str | None:
    """The interpreter the workload runs under, when it is a Python program.

    ``python train.py`` resolves ``python`` on the job's PATH; ``torchrun ...`` or a
    script resolves through its ``#!`` line. None when it is not Python.
    """
    return interpreter_source(spec)[0]


def interpreter_source(spec: RunSpec) -> tuple[str | None, str]:
    """The workload's interpreter (None: not a Python program) and how it was found, in
    words: ``the command's "python", found on PATH``. Preflight's version checks name both,
    since a ``python`` on the job's PATH may be another environment than the user's."""
    prog = _argv0(spec)
    program = resolve_program(spec)
    if prog is None or program is None:
        return None, (f'the command\'s "{prog}" is not found' if prog
                      else "the command starts with a shell builtin")  # fmt: skip
    on_path = ", found on PATH" + (" from [env]" if "PATH" in spec.env else "")
    if Path(program).name.startswith("python"):
        return program, f'the command\'s "{prog}"' + ("" if "/" in prog else on_path)
    try:
        with open(program, "rb") as f:
            first = f.readline(256)
    except OSError:
        return None, f"{program} cannot be read"
    if first.startswith(b"#!"):
        line = first[2:].decode(errors="replace").strip()
        parts = line.split()
        if parts and Path(parts[0]).name == "env" and len(parts) > 1:
            parts = parts[1:]
        if parts and Path(parts[0]).name.startswith("python"):
            how = f'the #! line "{line[:80]}" of {program}'
            if "/" in parts[0]:
                return parts[0], how
            return shutil.which(parts[0], path=_search_path(spec)), how + on_path
    return None, f'the command\'s "{prog}" ({program}) is not a Python program'


def check_static(spec: RunSpec) -> None:
    """Bad input that can be seen without running anything; raises PreflightError."""
    problems: list[str] = []
    workdir = spec.workdir_path
    try:
        is_dir = workdir.is_dir()
        why = "is not a directory"
    except OSError as exc:  # a name too long for the file system (ENAMETOOLONG), EACCES
        is_dir, why = False, f"cannot be used ({exc.strerror})"
    if not is_dir:
        problems.append(f"workdir: {workdir} {why}; fix `workdir` in {spec.source}")
    else:
        prog = _argv0(spec)
        if prog is not None and resolve_program(spec) is None:
            where = f"in {workdir}" if "/" in prog else "on PATH"
            problems.append(
                f"command: {prog!r} was not found {where} (or is not executable); "
                f"install it, or fix `command` in {spec.source}"
            )
    if spec.resources.processes > 1:
        from acceptrun.workload.distributed import launch_command

        try:  # a command torchrun cannot start is bad input, found before any record
            launch_command(spec)
        except SpecError as exc:
            problems.extend(exc.problems)
    if spec.checkpoint.resume_args and spec.shell and _SHELL_LIST & set(spec.command[2]):
        problems.append(  # they are appended to the command: after a pipe, they miss the script
            f"checkpoint.resume_args: {spec.checkpoint.resume_args!r} are appended to the "
            f"command, but {spec.command[2]!r} is a shell list, pipeline or redirection, so "
            'they would not reach the script; write the command as a list (["python", '
            '"train.py", ...]) or as one simple command, and redirect in the script'
        )
    if spec.data.path and "://" not in spec.data.path:
        path = Path(spec.resolve_path(spec.data.path))
        if not path.exists():
            problems.append(f"data.path: {path} does not exist; fix `data.path` in {spec.source}")
    if spec.data.manifest:
        manifest = Path(spec.resolve_path(spec.data.manifest))
        if not manifest.exists():
            problems.append(
                f"data.manifest: {manifest} does not exist; create it with "
                f"`acceptrun data snapshot {spec.data.path} -o {spec.data.manifest}`"
            )
    if spec.serving.payload:  # a serving run's request bodies: read now, not mid-load
        from acceptrun.serving.load import load_bodies

        try:
            load_bodies(spec.resolve_path(spec.serving.payload))
        except (OSError, ValueError) as exc:
            problems.append(f"serving.payload: {exc}; fix `serving.payload` in {spec.source}")
    if problems:
        raise PreflightError(
            "cannot launch:\n  " + "\n  ".join(problems) if len(problems) > 1 else problems[0]
        )


# ---- inside the record ---------------------------------------------------------------------


def run_preflight(record: RunRecord, spec: RunSpec, *, existing: str | None = None) -> Preflight:
    """Run every preflight check, write provenance.json and preflight.json.

    ``existing`` overrides ``checkpoint.existing`` (``acceptrun run --existing``; the
    drill's second run moves the reference run's files aside).

    Each check's outcome is logged (``preflight data: ok - ...``) as it is decided.
    """
    result = Preflight()
    started = now_iso()

    t0 = time.perf_counter()
    python, how = interpreter_source(spec)
    # The job's environment ([env] over this one): its PYTHONPATH decides which packages the
    # workload imports, and a restart lists them again under it (capture/reverify.py).
    prov = provenance.capture(
        python=python, cwd=spec.workdir_path, diff_path=record.file("git.diff"),
        exclude=[record.path.parent.parent],  # the workspace: acceptrun's files, not the code's
        env={**os.environ, **spec.env},
    )  # fmt: skip
    from acceptrun.checkpoint.owner import store_root

    ckpt_dir = store_root(record, spec)  # the run's own store (checkpoint.dir/<run id>/)
    leftovers: list[dict[str, Any]] = []
    if spec.checkpoint.watch:  # what a fresh run finds there before its first attempt
        from acceptrun.checkpoint.leftovers import find_leftovers

        exclude = [record.path.parent.parent, ckpt_dir.parent]
        leftovers = find_leftovers(spec.checkpoint.watch, spec.workdir_path, exclude)
        prov["watched_existing"] = {
            "mode": existing or spec.checkpoint.existing,
            "files": leftovers,
        }
    record.write_json("provenance.json", prov)
    absent = sorted(k for k, v in prov.items() if isinstance(v, dict) and v.get("absent"))
    msg = "recorded" + (f"; absent: {', '.join(absent)}" if absent else "")
    result.checks.append(
        Check(
            "provenance", True, msg, time.perf_counter() - t0, {"python": python, "absent": absent}
        )
    )

    result.checks.append(_timed("expectations", lambda: check_expectations(spec, prov)))
    result.checks.append(_timed("resources", lambda: check_resources(spec, prov)))
    if spec.checkpoint.watch:
        result.checks.append(
            _timed(
                "watched files",
                lambda: check_watched_existing(record, spec, leftovers, existing),
            )
        )
    result.checks.append(_timed("storage", lambda: check_storage([record.path, ckpt_dir])))
    from acceptrun.capture.needs import check_needs

    result.checks.append(_timed("dependencies", lambda: check_needs(spec, prov, python, how)))
    gpus = prov.get("gpus", {})
    if spec.resources.gpus > 0 or (not gpus.get("absent") and gpus.get("count", 0) > 0):
        result.checks.append(_timed("device", lambda: check_device(python)))
    if spec.data.path:
        result.checks.append(_timed("data", lambda: check_data(spec)))
        _keep_data_stats(record, result.checks[-1])
    if spec.resources.processes > 1:
        result.checks.append(_timed("backend", lambda: check_backend(spec)))

    for c in result.checks:
        status = "FAILED" if not c.ok else "WARNING" if c.details.get("warning") else "ok"
        _log.info(f"preflight {c.name}: {status} - {c.message}")
    record.write_json(
        "preflight.json",
        {
            "ok": result.ok,
            "started_at": started,
            "ended_at": now_iso(),
            "checks": [c.to_dict() for c in result.checks],
        },
    )
    return result


def _timed(name: str, fn: Callable[[], tuple[bool, str, dict[str, Any]]]) -> Check:
    t0 = time.perf_counter()
    try:
        ok, message, details = fn()
    except Exception as exc:  # a check that crashes is a failed check, with the reason
        ok, message, details = False, f"{type(exc).__name__}: {exc}", {}
    return Check(name, ok, message, time.perf_counter() - t0, details)


def check_watched_existing(
    record: RunRecord,
    spec: RunSpec,
    leftovers: list[dict[str, Any]],
    existing: str | None = None,
) -> tuple[bool, str, dict[str, Any]]:
    """What ``checkpoint.watch`` already matches before the first attempt, and what
    ``checkpoint.existing`` does with it (checkpoint/leftovers.py)."""
    from acceptrun.checkpoint.leftovers import describe, move_aside

    mode = existing or spec.checkpoint.existing
    details: dict[str, Any] = {"mode": mode, "files": leftovers}
    if not leftovers:
        return True, "no file matches checkpoint.watch yet: the run starts from scratch", details
    named = "; ".join(describe(e) for e in leftovers)
    if mode == "start":
        details["warning"] = True
        return True, (
            f"the run begins from files it did not write: {named} "
            '(declared by checkpoint.existing = "start")'
        ), details  # fmt: skip
    if mode == "move":
        details["moved_to"] = move_aside(leftovers, spec.workdir_path, record.file("leftovers"))
        return (
            True,
            f"moved aside into {record.file('leftovers')} before attempt 1: {named}",
            details,
        )
    return False, (
        f"checkpoint.watch already matches {named}, left by an earlier run: a script that "
        "loads it would begin this run from a file the run did not write. Move it aside, or "
        'set checkpoint.existing = "move" (acceptrun moves it into the record) or "start" '
        "(begin from it, named in the verdict), or run with --existing move|start"
    ), details  # fmt: skip


def check_expectations(spec: RunSpec, prov: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
    """Compare ``[expect]`` with what provenance found."""
    exp = spec.expect
    rows: list[dict[str, Any]] = []

    def check(what: str, pattern: str | None, found: str | None, kind: str = "version") -> None:
        if pattern is not None:
            rows.append(
                {
                    "what": what,
                    "expected": pattern,
                    "found": found,
                    "ok": match_pattern(pattern, found, kind=kind),
                }
            )

    check("python", exp.python, prov.get("python", {}).get("version"))
    packages = prov.get("packages", {}).get("list", {})
    for name, pattern in exp.packages.items():
        check(f"package {name}", pattern, packages.get(_normalize(name)))
    torch = prov.get("torch", {})
    if exp.cuda == "none":
        rows.append(
            {
                "what": "torch CUDA",
                "expected": "none (CPU build)",
                "found": torch.get("cuda"),
                "ok": not torch.get("cuda"),
            }
        )
    else:
        check("torch CUDA", exp.cuda, torch.get("cuda"))
    gpus = prov.get("gpus", {})
    check("driver", exp.driver, gpus.get("driver"))
    if exp.gpu is not None:
        names = [d.get("name") for d in gpus.get("devices", [])]
        ok = bool(names) and all(match_pattern(exp.gpu, n, kind="name") for n in names)
        rows.append(
            {
                "what": "gpu",
                "expected": exp.gpu,
                "found": ", ".join(map(str, names)) or None,
                "ok": ok,
            }
        )
    asked = _asked(spec, prov)  # the interpreter that python, packages and torch were read in
    for row in rows:
        if row["what"] in ("python", "torch CUDA") or row["what"].startswith("package "):
            row["where"] = asked
    bad = [r for r in rows if not r["ok"]]
    if not rows:
        return True, "no expectations in the spec", {"rows": rows}
    if bad:
        text = "; ".join(
            f"{r['what']}: expected {r['expected']}, found {r['found'] or 'nothing'}"
            + (f" in {r['where']}" if r.get("where") else "")
            for r in bad
        )
        return False, text, {"rows": rows}
    return (
        True,
        f"{len(rows)} met (" + ", ".join(f"{r['what']} {r['found']}" for r in rows) + ")",
        {"rows": rows},
    )


def _asked(spec: RunSpec, prov: dict[str, Any]) -> str:
    """``/usr/bin/python3 (the command's "python", found on PATH)``: the interpreter
    provenance asked (the workload's, else acceptrun's own) and how it was found."""
    python, how = interpreter_source(spec)
    if python is None:
        probed = prov.get("python")
        recorded = probed.get("executable") if isinstance(probed, dict) else None
        python, how = recorded or sys.executable, f"acceptrun's own interpreter: {how}"
    return f"{python} ({how})"


def check_resources(spec: RunSpec, prov: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
    """GPU count, model and memory against ``[resources]``."""
    res = spec.resources
    if res.gpus == 0:
        return True, "CPU run (resources.gpus = 0)", {}
    gpus = prov.get("gpus", {})
    if gpus.get("absent"):
        return False, f"resources.gpus = {res.gpus} but no GPU was found ({gpus.get('reason')})", {}
    devices = gpus.get("devices", [])
    problems = []
    if len(devices) < res.gpus:
        problems.append(f"needs {res.gpus} GPU(s), found {len(devices)}")
    for d in devices[: res.gpus]:
        name = str(d.get("name"))
        if res.gpu_types and not any(match_pattern(p, name, kind="name") for p in res.gpu_types):
            problems.append(f"GPU {d.get('index')} is {name}, not one of {res.gpu_types}")
        mem_gb = (d.get("memory_total_bytes") or 0) / 2**30
        if res.min_gpu_memory_gb and mem_gb < res.min_gpu_memory_gb:
            problems.append(
                f"GPU {d.get('index')} has {mem_gb:.0f} GiB, needs {res.min_gpu_memory_gb:g}"
            )
    if problems:
        return False, "; ".join(problems), {}
    return True, f"{len(devices)} GPU(s): " + ", ".join(str(d.get("name")) for d in devices), {}


# What a script that needs GPUs for its collectives says (a static scan of its text).
_GPU_ONLY = re.compile(
    r"""nccl|\.cuda\(|device\s*=\s*["']cuda|torch\.cuda\.set_device""", re.IGNORECASE
)


def check_backend(spec: RunSpec) -> tuple[bool, str, dict[str, Any]]:
    """A CPU run of several processes whose script asks for NCCL or CUDA devices: a warning.

    NCCL runs only between GPUs, so such a run fails at its first collective (or at
    ``.cuda()``); on CPUs the backend is gloo. A static scan of the command's script,
    so it can only warn (the script may choose at run time); never a failure.
    """
    res = spec.resources
    if res.processes <= 1 or res.gpus > 0:
        return True, f"{res.processes} process(es), resources.gpus = {res.gpus}", {}
    script = _command_script(spec)
    if script is None:
        return True, "no Python script found in the command to scan", {}
    try:
        lines = script.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        return True, f"cannot read {script} to scan it ({exc})", {}
    hits = [
        f"line {n}: {line.strip()[:80]}"
        for n, line in enumerate(lines, 1)
        if _GPU_ONLY.search(line) and not line.lstrip().startswith("#")
    ]
    if not hits:
        return True, f"{script.name} names no NCCL or CUDA device call", {"script": str(script)}
    message = (
        f"warning: a CPU run (resources.gpus = 0) of {res.processes} processes, but "
        f"{script.name} uses nccl or CUDA device calls ({'; '.join(hits[:3])}); NCCL needs "
        'GPUs: use the gloo backend on CPUs, e.g. dist.init_process_group("gloo" if not '
        'torch.cuda.is_available() else "nccl"), and keep tensors on the CPU'
    )
    return True, message, {"warning": True, "script": str(script), "lines": hits[:10]}


def _command_script(spec: RunSpec) -> Path | None:
    """The ``.py`` file the command runs (``python train.py``, ``torchrun ... train.py``)."""
    words = list(spec.command)
    if spec.shell:
        try:
            words = shlex.split(spec.command[2])
        except ValueError:
            return None
    for word in words[1:]:
        if word.endswith(".py"):
            path = Path(word) if Path(word).is_absolute() else spec.workdir_path / word
            return path if path.is_file() else None
    return None


def storage_smoke(directory: Path, size: int = SMOKE_BYTES) -> dict[str, Any]:
    """Write, fsync, read back and compare ``size`` bytes in ``directory``; MB/s both ways."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = os.urandom(size)
    path = directory / f".acceptrun-smoke-{os.getpid()}"
    try:
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        t1 = time.perf_counter()
        with open(path, "rb") as f:
            back = f.read()
        t2 = time.perf_counter()
    finally:
        path.unlink(missing_ok=True)
    mb = size / 1e6
    return {
        "dir": str(directory),
        "ok": back == payload,
        "write_mb_s": round(mb / max(t1 - t0, 1e-9), 1),
        "read_mb_s": round(mb / max(t2 - t1, 1e-9), 1),
        "free_bytes": shutil.disk_usage(directory).free,
    }


def check_storage(dirs: list[Path]) -> tuple[bool, str, dict[str, Any]]:
    results = []
    for d in dict.fromkeys(dirs):
        try:
            results.append(storage_smoke(d))
        except OSError as exc:
            results.append({"dir": str(d), "ok": False, "error": f"{exc.strerror or exc}"})
    bad = [r for r in results if not r["ok"]]
    if bad:
        return (
            False,
            "; ".join(f"{r['dir']}: {r.get('error', 'read-back differs')}" for r in bad),
            {"dirs": results},
        )
    text = ", ".join(f"{Path(r['dir']).name}/ write {r['write_mb_s']:.0f} MB/s" for r in results)
    return True, text, {"dirs": results}


def check_device(python: str | None) -> tuple[bool, str, dict[str, Any]]:
    smoke = provenance.device_smoke(python=python)
    if not smoke.get("ran"):
        return True, f"skipped: {smoke.get('reason')}", smoke
    if not smoke.get("ok"):
        return False, f"GPU smoke test failed: {smoke.get('error') or smoke}", smoke
    parts = [
        f"GPU {d.get('index')} bf16 {d.get('matmul_bf16_tflops')} TFLOP/s"
        for d in smoke.get("devices", [])
    ]
    return True, "; ".join(parts) or "ok", smoke


def check_data(spec: RunSpec) -> tuple[bool, str, dict[str, Any]]:
    assert spec.data.path is not None
    source = spec.resolve_path(spec.data.path)
    if not spec.data.manifest:
        return True, f"{source}: no manifest in the spec, so not verified", {"verified": False}
    manifest_path = spec.resolve_path(spec.data.manifest)
    manifest = datamod.load_manifest(manifest_path)
    from acceptrun.capture.reverify import data_baseline

    stats = data_baseline(spec, manifest.get("exclude", ()))  # before hashing: see its doc
    result = datamod.verify(source, manifest, ignore=[manifest_path])
    details = {"verified": result.ok, **result.to_dict()}
    if not result.ok:
        return False, datamod.format_verify(result).replace("\n", "; "), details
    if stats is not None:
        details["stat_signatures"] = stats  # moved to data_stats.json by run_preflight
    return True, result.summary(), details


def _keep_data_stats(record: RunRecord, check: Check) -> None:
    """The verified files' stat signatures go to data_stats.json, not preflight.json: one
    line per file is what a restart compares (capture/reverify.py), not a check's evidence."""
    from acceptrun.capture.reverify import DATA_STATS_FILE

    stats = check.details.pop("stat_signatures", None)
    if stats is not None and check.ok:
        record.write_json(DATA_STATS_FILE, stats)


def _normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")
