"""Before a restarted attempt: is the data and the environment still what preflight verified?

Preflight (:mod:`acceptrun.capture.preflight`) verifies the data against its manifest and
records the workload interpreter's packages (provenance.json) once, before attempt 1. A
restart (attempt 2 and later, and the first attempt of ``acceptrun resume``) runs
:meth:`Reverifier.check` first, through the supervisor's restart policy
(supervisor/restarts.py), cheaply:

- **the data**: every file of ``[data] path`` is stat-ed and compared with the
  signature (size, mtime_ns, inode, ctime_ns) preflight took before hashing it
  (``data_stats.json`` in the record; a file changed within 2 s of that stat has none,
  data.SETTLE_NS); only a file without the same signature is hashed again and compared
  with the manifest. An unchanged data set costs one ``stat`` per file. A
  remote (fsspec) source has no such signature and is not re-verified (the event says so).
- **the environment**: the packages of the interpreter provenance read them from, listed
  again by one probe subprocess (``_probe.py --packages``: metadata headers only, no
  package imported: 0.1 to 0.2 s for 207 packages on a loaded 2-core machine,
  bench/reverify.py), compared with provenance.json's list.

A change refuses the attempt: the supervisor records it as not started, class
``setup_changed`` (whose: the workload's, record/status.py says why), and the run stops.
A ``reverify`` event carries every check's findings and cost; a failed check is appended
to preflight.json (``"attempt": N``), where the verdict reads preflight's own checks, so
the data check or the setup check fails with the evidence.

>>> check = Reverifier.for_run(record, spec, env)
>>> check.check(2)  # None: unchanged; else the Classification that refuses attempt 2
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.console import get_logger
from acceptrun.capture import data as datamod
from acceptrun.capture.preflight import Check
from acceptrun.capture.provenance import PROBE
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec
from acceptrun.supervisor.classify import MAX_EVIDENCE, Classification

__all__ = [
    "DATA_STATS_FILE",
    "Finding",
    "Reverifier",
    "compare_packages",
    "data_baseline",
    "list_packages",
    "reverifier_for",
    "reverify_data",
]

_log = get_logger(__name__)

DATA_STATS_FILE = "data_stats.json"
PACKAGES_TIMEOUT_S = 60.0  # the probe lists metadata only: ~0.1 s, seconds under heavy load
CLASS = "setup_changed"
_NEW_RUN = (
    "or start a new run: the record of this one would no longer say what it trained on, "
    "so its result could not be reproduced from it"
)
DATA_FIX = (
    "restore the data preflight verified (the manifest names every file, size and hash), "
    f"then `acceptrun resume RUN`; {_NEW_RUN}"
)
ENV_FIX = (
    f"reinstall the recorded versions (provenance.json), then `acceptrun resume RUN`; {_NEW_RUN}"
)


@dataclass(slots=True)
class Finding(Check):
    """One re-verified part (``data`` or ``environment``): a preflight check's outcome and
    cost, with the lines of evidence the refused attempt's exit carries."""

    evidence: list[str] = field(default_factory=list)

    def to_event(self) -> dict[str, Any]:
        return {"ok": self.ok, "message": self.message, "seconds": round(self.seconds, 4),
                **self.details}  # fmt: skip


def _is_remote(source: str) -> bool:
    return ("://" in source or "::" in source) and not source.startswith("file://")


def data_baseline(spec: RunSpec, exclude: Any = ()) -> dict[str, Any] | None:
    """The stat signatures of ``[data] path``'s files, taken before preflight hashes them
    (written as data_stats.json once the data verified); None for a remote source."""
    if not spec.data.path or _is_remote(spec.data.path):
        return None
    source = spec.resolve_path(spec.data.path)
    files = datamod.stat_signatures(source, list(exclude))
    return None if files is None else {"source": source, "files": files}


def reverify_data(record: RunRecord, spec: RunSpec) -> Finding | None:
    """The data against its manifest, hashing only the files whose stat changed; None when
    the spec does not verify its data (no ``data.manifest``)."""
    if not spec.data.path or not spec.data.manifest:
        return None
    t0 = time.perf_counter()
    source = spec.resolve_path(spec.data.path)
    baseline = record.read_json(DATA_STATS_FILE, default=None)
    if not isinstance(baseline, dict) or not isinstance(baseline.get("files"), dict):
        why = "a remote source" if _is_remote(spec.data.path) else f"no {DATA_STATS_FILE}"
        return Finding("data", True, f"{source}: not re-verified ({why}: preflight took no "
                       "stat signatures)", time.perf_counter() - t0, {"skipped": True})  # fmt: skip
    manifest_path = spec.resolve_path(spec.data.manifest)
    try:
        manifest = datamod.load_manifest(manifest_path)
        result = datamod.verify(source, manifest, ignore=[manifest_path], trust=baseline["files"])
    except Exception as exc:  # a data set gone, a manifest damaged: a change, named
        text = f"{type(exc).__name__}: {exc}"
        return Finding("data", False, f"{source}: {text}", time.perf_counter() - t0,
                       {"source": source}, [text])  # fmt: skip
    seconds = time.perf_counter() - t0
    details = {"source": source, "files": result.count, "stat_only": result.trusted,
               "rehashed": result.hashed, "rehashed_bytes": result.checked_bytes}  # fmt: skip
    if result.ok:
        files = "1 file" if result.count == 1 else f"{result.count:,} files"
        msg = (f"{files} unchanged: {result.trusted:,} by their stat signature, "
               f"{details['rehashed']:,} hashed again ({result.checked_bytes:,} bytes)")  # fmt: skip
        return Finding("data", True, msg, seconds, details)
    evidence = _data_evidence(result)
    details.update(changed=[_changed(c) for c in result.changed][:MAX_EVIDENCE],
                   missing=result.missing[:MAX_EVIDENCE], extra=result.extra[:MAX_EVIDENCE])  # fmt: skip
    msg = f"data {source} changed since preflight: " + "; ".join(evidence)
    return Finding("data", False, msg, seconds, details, evidence)


def _changed(c: datamod.Changed) -> dict[str, Any]:
    return {"path": c.path, "expected_size": c.expected_size, "found_size": c.found_size,
            "expected_hash": c.expected_hash, "found_hash": c.found_hash}  # fmt: skip


def _data_evidence(result: datamod.VerifyResult) -> list[str]:
    lines = []
    for c in result.changed:
        if c.found_hash is None:
            lines.append(f"{c.path}: size {c.expected_size} expected, {c.found_size} found")
        else:
            lines.append(f"{c.path}: hash {c.expected_hash} expected, {c.found_hash} found")
    lines += [f"{p}: missing" for p in result.missing]
    lines += [f"{p}: not in the manifest (a file added)" for p in result.extra]
    return lines[:MAX_EVIDENCE]


def compare_packages(recorded: Mapping[str, str], found: Mapping[str, str]) -> list[str]:
    """One line per package whose version differs, appeared or went: ``numpy 2.0.1 -> 2.1.0``."""
    lines = []
    for name in sorted(recorded.keys() | found.keys()):
        was, now = recorded.get(name), found.get(name)
        if was != now:
            lines.append(f"{name} {was or '(not installed)'} -> {now or '(not installed)'}")
    return lines


def list_packages(python: str, env: Mapping[str, str], cwd: Path | None = None) -> dict[str, str]:
    """The packages of ``python`` under ``env`` in ``cwd``, as provenance lists them.

    One subprocess that reads the distributions' metadata headers and imports nothing.
    Raises RuntimeError with the reason when it cannot tell.
    """
    try:
        done = subprocess.run(
            [python, str(PROBE), "--packages"], stdin=subprocess.DEVNULL, capture_output=True,
            env=dict(env), timeout=PACKAGES_TIMEOUT_S, check=False,
            cwd=cwd if cwd is not None and cwd.is_dir() else None,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"could not list the packages of {python} ({exc})") from None
    try:
        part = json.loads(done.stdout)["packages"]
        listed = part["list"]
    except (ValueError, KeyError, TypeError):
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(
            f"could not list the packages of {python} (exit status {done.returncode}: {tail[0]})"
        ) from None
    return {str(k): str(v) for k, v in listed.items()}


@dataclass(slots=True)
class Reverifier:
    """What a restart compares, read once from the record (module docstring)."""

    record: RunRecord
    spec: RunSpec
    env: dict[str, str]
    """The job's environment as provenance read the packages under it."""

    @classmethod
    def for_run(
        cls, record: RunRecord, spec: RunSpec, base_env: Mapping[str, str] | None = None
    ) -> Reverifier:
        env = {**(os.environ if base_env is None else base_env), **spec.env}
        return cls(record, spec, env)

    def check(self, attempt: int) -> Classification | None:
        """Re-verify before ``attempt``: None when unchanged, else why it must not start.

        Records a ``reverify`` event either way, and each failed part in preflight.json.
        """
        findings = [f for f in (reverify_data(self.record, self.spec), self._environment()) if f]
        if not findings:
            return None
        failed = [f for f in findings if not f.ok]
        fields: dict[str, Any] = {f.name: f.to_event() for f in findings}
        fields.update(attempt=attempt, ok=not failed,
                      seconds=round(sum(f.seconds for f in findings), 4))  # fmt: skip
        self.record.event("reverify", sync=True, **fields)
        for f in findings:
            _log.info(
                f"before attempt {attempt}, {f.name}: {'ok' if f.ok else 'CHANGED'} - {f.message}"
            )
        if not failed:
            return None
        self._add_to_preflight(attempt, failed)
        evidence = [line for f in failed for line in f.evidence][:MAX_EVIDENCE]
        what = " and ".join("the data" if f.name == "data" else "the environment" for f in failed)
        return Classification(
            CLASS, evidence, False,
            f"{what} changed since preflight verified it: " + "; ".join(f.message for f in failed),
        )  # fmt: skip

    def _environment(self) -> Finding | None:
        """The interpreter's packages against provenance.json's; None when none were recorded."""
        prov = self.record.read_json("provenance.json", default=None) or {}
        part = prov.get("packages") if isinstance(prov, dict) else None
        if (
            not isinstance(part, dict)
            or part.get("absent")
            or not isinstance(part.get("list"), dict)
        ):
            return None
        python = _recorded_python(self.record)
        if python is None:  # not a Python program: the packages listed are acceptrun's own
            return None
        t0 = time.perf_counter()
        try:
            found = list_packages(python, self.env, self.spec.workdir_path)
        except RuntimeError as exc:  # cannot tell: named, never taken for a change
            return Finding("environment", True, f"not re-verified: {exc}",
                           time.perf_counter() - t0, {"python": python, "skipped": True})  # fmt: skip
        seconds = time.perf_counter() - t0
        changes = compare_packages(part["list"], found)
        details = {"python": python, "packages": len(found)}
        if not changes:
            return Finding("environment", True, f"{len(found)} packages of {python} unchanged",
                           seconds, details)  # fmt: skip
        details["changed"] = changes[:20]
        evidence = [f"package {line} in {python}" for line in changes]
        return Finding("environment", False, "; ".join(evidence[:MAX_EVIDENCE]), seconds,
                       details, evidence)  # fmt: skip

    def _add_to_preflight(self, attempt: int, failed: list[Finding]) -> None:
        """Append the failed parts to preflight.json, as checks of the attempt they refused."""
        pre = self.record.read_json("preflight.json", default=None)
        if not isinstance(pre, dict) or not isinstance(pre.get("checks"), list):
            pre = {"checks": []}
        for f in failed:
            fix = DATA_FIX if f.name == "data" else ENV_FIX
            pre["checks"].append({
                **f.to_dict(), "attempt": attempt,
                "message": f"before attempt {attempt}: {f.message}",
                "details": {**f.details, "verified": False, "fix": fix},
            })  # fmt: skip
        self.record.write_json("preflight.json", pre)


def _recorded_python(record: RunRecord) -> str | None:
    """The interpreter preflight read the packages of (its provenance check's details)."""
    pre = record.read_json("preflight.json", default=None) or {}
    for c in pre.get("checks", []) if isinstance(pre, dict) else []:
        if isinstance(c, dict) and c.get("name") == "provenance":
            python = (c.get("details") or {}).get("python")
            return str(python) if python else None
    return None


def reverifier_for(
    record: RunRecord, spec: RunSpec, base_env: Mapping[str, str] | None = None
) -> Any:
    """The supervisor's restart check (``Supervisor(reverify=...)``): Reverifier.check."""
    return Reverifier.for_run(record, spec, base_env).check
