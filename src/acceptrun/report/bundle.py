"""The support bundle: one redacted archive of a run, for a provider's support or a colleague.

``acceptrun bundle RUN -o FILE`` gathers what someone away from the machine needs to
judge a failure: provenance, the spec, events, each attempt's exit record and stderr
tail, telemetry and the GPU timeline drawn from it, the verdict, the cost ledger, the
report, and the checkpoints' manifests (never the tensors). Every file passes through
the one redactor (:mod:`acceptrun._util.redact`) with the run's own secrets learned from
its frozen spec, so a token the spec hands the workload is hidden wherever the workload
printed it. ``MANIFEST.json`` holds each file's size and sha256, and what was left out;
``README.txt`` says the same in words; ``SHA256SUMS`` serves ``sha256sum -c``.

The archive is a gzip-compressed tar (``.tar.gz``): the standard library writes it as a
stream into one open file, it keeps the paths and times of the record, and every Linux
or macOS machine opens it with ``tar xzf``. It is written like any other acceptrun file
(:func:`acceptrun._util.durable.write_atomic`: a temporary file, fsync, rename), so a
bundle cut short by a full disk never leaves a truncated archive under the name asked for.

>>> # build_bundle(ws.get_run("latest"), Path("run.tar.gz"))
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from acceptrun._util.durable import read_jsonl, write_atomic
from acceptrun._util.redact import learn_spec, redact_obj, redact_text
from acceptrun.errors import UserError
from acceptrun.record.models import stamp
from acceptrun.record.workspace import RunRecord, now_iso

__all__ = ["BUNDLE_README", "Bundle", "build_bundle", "check_output"]

TAIL_BYTES = 64 * 1024  # the last 64 KiB of each attempt's stderr: a traceback and its lead-up
# Record files copied (redacted) when present, in the order a reader wants them.
RECORD_JSON = (
    "run.json",
    "provenance.json",
    "preflight.json",
    "supervisor.json",
    "summary.json",
    "verdict.json",
)
RECORD_JSONL = ("events.jsonl", "telemetry.jsonl", "cost.jsonl")
ATTEMPT_JSON = ("exit.json", "processes.json")
GPU_KINDS = ("gpu", "xid", "gpu_absent")  # telemetry.jsonl lines of the GPU timeline

BUNDLE_README = """\
acceptrun support bundle of run {run_id} ({name})
made {made_at} by acceptrun {version}

What it holds (every file redacted: credentials in URLs, secret-looking assignments and
options, and the values of the run's secret [env] entries and of this shell's secret
variables are replaced by <redacted>):

{holds}

What it leaves out:

{left_out}

MANIFEST.json lists every other file of this archive with its size and sha256, and
SHA256SUMS the same for `sha256sum`: check a copy with

  cd {run_id} && sha256sum -c SHA256SUMS
"""

_WHAT = {
    "run.json": "the run's state: status, verdict, attempts",
    "provenance.json": "where and what ran: host, GPUs, drivers, packages, git commit",
    "preflight.json": "the checks before launch and their outcome",
    "supervisor.json": "the supervisor's own record",
    "summary.json": "the run's summary figures",
    "verdict.json": "the verdict, its checks and the fix each failed check gives",
    "events.jsonl": "every event of the run, one JSON object a line",
    "telemetry.jsonl": "host and GPU samples over the run",
    "cost.jsonl": "people's time and switching costs added to the run",
    "gpu_timeline.jsonl": "the GPU samples, Xid errors and NVML absence from telemetry",
    "ledger.json": "the cost ledger: billed time, its split, whose failure the waste was",
    "spec.toml": "the frozen spec the run used",
    "report.html": "the run's report (open it in a browser)",
}


@dataclass
class Bundle:
    """What :func:`build_bundle` wrote: the archive, its files and what it left out."""

    path: Path
    files: list[dict[str, Any]] = field(default_factory=list)  # path, bytes, sha256
    left_out: list[str] = field(default_factory=list)
    bytes: int = 0


def check_output(path: Path, record: RunRecord, *, force: bool) -> Path:
    """The archive's path, refused when it would overwrite a file without ``force``, when
    its folder does not exist, or when it lies inside the run's record (its own input)."""
    if path.is_dir():
        raise UserError(f"-o {path}: is a folder; give a file name, e.g. -o {path}/run.tar.gz")
    if path.exists() and not force:
        raise UserError(
            f"{path} already exists; pass --force to overwrite it, or give another file name"
        )
    if not path.parent.is_dir():
        raise UserError(f"-o {path}: the folder {path.parent} does not exist; create it first")
    if path.resolve().is_relative_to(record.path.resolve()):
        raise UserError(
            f"-o {path}: inside the run's record {record.path}; write the bundle elsewhere, "
            f"e.g. -o {record.run_id}.tar.gz"
        )
    if not path.name.endswith((".tar.gz", ".tgz")):
        raise UserError(f"-o {path}: the bundle is a gzip-compressed tar; name it *.tar.gz")
    return path


def _tail(path: Path, limit: int = TAIL_BYTES) -> tuple[str, bool]:
    """The last ``limit`` bytes of a log as text, and whether it was cut."""
    with path.open("rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - limit))
        data = f.read()
    if size > limit:  # start at a whole line
        data = data[data.find(b"\n") + 1 :] if b"\n" in data else data
    return data.decode("utf-8", "replace"), size > limit


def _json_text(obj: Any) -> str:
    return json.dumps(redact_obj(obj), indent=2, sort_keys=True, default=str) + "\n"


def _jsonl_text(lines: Iterator[dict[str, Any]]) -> str:
    return "".join(json.dumps(redact_obj(x), sort_keys=True, default=str) + "\n" for x in lines)


class _Writer:
    """Collects the bundle's files (name -> redacted bytes) and what was left out."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.holds: list[str] = []
        self.left_out: list[str] = []

    def add(self, name: str, text: str, what: str) -> None:
        # One mechanism: every byte of the bundle passes redact_text (JSON went through
        # redact_obj first, for secret-keyed values), whatever produced it.
        self.files[name] = redact_text(text).encode()
        self.holds.append(f"  {name}: {what}")


def _gather(record: RunRecord, *, include_logs: bool) -> _Writer:
    from acceptrun._util.durable import read_json
    from acceptrun.spec.load import loads_toml

    out = _Writer()
    spec_text = record.spec_path.read_text(encoding="utf-8")
    spec_raw = loads_toml(spec_text)
    learn_spec(spec_raw)  # its [env] secrets are hidden wherever the workload printed them
    out.add("spec.toml", spec_text, _WHAT["spec.toml"])
    for name in RECORD_JSON:
        p = record.file(name)
        if p.is_file():
            out.add(name, _json_text(read_json(p)), _WHAT[name])
        else:
            out.left_out.append(f"{name}: not in the record (this run wrote none)")
    for name in RECORD_JSONL:
        p = record.file(name)
        if p.is_file():
            out.add(name, _jsonl_text(read_jsonl(p)), _WHAT[name])
    if record.telemetry_path.is_file():
        gpu = (x for x in read_jsonl(record.telemetry_path) if x.get("kind") in GPU_KINDS)
        out.add("gpu_timeline.jsonl", _jsonl_text(gpu), _WHAT["gpu_timeline.jsonl"])
    else:
        out.left_out.append("telemetry.jsonl, gpu_timeline.jsonl: the run recorded no telemetry")
    _ledger(record, out)
    report = record.file("report.html")
    if report.is_file():
        out.add(
            "report.html",
            report.read_text(encoding="utf-8", errors="replace"),
            _WHAT["report.html"],
        )
    _attempts(record, out, include_logs=include_logs)
    _manifests(record, out)
    out.left_out += [
        "checkpoint tensors and optimizer state: only their manifests (names, sizes, digests)",
        "outputs (models, files the run registered): their names and sizes are in events.jsonl",
        "the step log (attempts/<n>/steps, binary): its curves are in report.html",
        "the workdir and the code: provenance.json names the git commit",
    ]
    return out


def _ledger(record: RunRecord, out: _Writer) -> None:
    from acceptrun.cost.catalog import load_catalog
    from acceptrun.cost.report import ledger_for

    try:
        ledger = ledger_for(record, load_catalog(record.path.parent.parent))
    except (UserError, OSError, ValueError) as exc:  # the bundle still goes out; it says why
        out.left_out.append(f"ledger.json: could not be built ({exc})")
        return
    out.add("ledger.json", _json_text(ledger), _WHAT["ledger.json"])


def _attempts(record: RunRecord, out: _Writer, *, include_logs: bool) -> None:
    from acceptrun._util.durable import read_json

    root = record.path / "attempts"
    numbers = (
        sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []
    )
    for n in numbers:
        d = record.attempt_dir(n)
        for name in ATTEMPT_JSON:
            if (d / name).is_file():
                what = (
                    "how the attempt ended: class, evidence, work lost"
                    if name == "exit.json"
                    else "its processes"
                )
                out.add(f"attempts/{n}/{name}", _json_text(read_json(d / name)), what)
        err = d / "stderr.log"
        if err.is_file():
            text, cut = _tail(err)
            what = f"the last {TAIL_BYTES // 1024} KiB of stderr" if cut else "the whole of stderr"
            out.add(f"attempts/{n}/stderr.tail.log", text, what)
        if include_logs:
            for name in ("stdout.log", "stderr.log"):
                if (d / name).is_file():
                    text = (d / name).read_text(encoding="utf-8", errors="replace")
                    out.add(f"attempts/{n}/{name}", text, f"the whole {name} (--include-logs)")
    if not include_logs and numbers:
        out.left_out.append(
            "the whole stdout.log and stderr.log of each attempt (only stderr's tail): "
            "`acceptrun bundle --include-logs` adds them, redacted"
        )


def _manifests(record: RunRecord, out: _Writer) -> None:
    from acceptrun.checkpoint.owner import store_root
    from acceptrun.checkpoint.store import MANIFEST
    from acceptrun.spec.model import load_spec

    try:
        root = store_root(record, load_spec(record.spec_path))
    except (UserError, OSError, ValueError) as exc:
        out.left_out.append(f"checkpoint manifests: the store was not found ({exc})")
        return
    found = sorted(root.glob(f"*/{MANIFEST}")) if root.is_dir() else []
    for p in found:
        out.add(
            f"checkpoints/{p.parent.name}/{MANIFEST}",
            p.read_text(encoding="utf-8", errors="replace"),
            "a checkpoint's manifest: its files, sizes and digests (no tensors)",
        )
    if not found:
        out.left_out.append("checkpoint manifests: the run left no checkpoint in its store")


def build_bundle(record: RunRecord, path: Path, *, include_logs: bool = False) -> Bundle:
    """Write the support bundle of ``record`` to ``path`` (a ``.tar.gz``), durably.

    Example: ``build_bundle(ws.get_run("latest"), Path("run.tar.gz")).files``.
    """
    from acceptrun import __version__

    state = record.state
    out = _gather(record, include_logs=include_logs)
    files = [
        {"path": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for name, data in out.files.items()
    ]
    manifest = {
        **stamp(),
        "run_id": record.run_id,
        "name": state.get("name"),
        "made_at": now_iso(),
        "include_logs": include_logs,
        "files": files,
        "left_out": out.left_out,
        "redaction": "every file passed acceptrun._util.redact (redact_text; JSON also redact_obj)",
    }
    readme = BUNDLE_README.format(
        run_id=record.run_id,
        name=state.get("name"),
        made_at=manifest["made_at"],
        version=__version__,
        holds="\n".join(out.holds),
        left_out="\n".join(f"  {x}" for x in out.left_out),
    )
    sums = "".join(f"{f['sha256']}  {f['path']}\n" for f in files)
    extra = {
        "README.txt": redact_text(readme).encode(),
        "MANIFEST.json": _json_text(manifest).encode(),
        "SHA256SUMS": sums.encode(),
    }
    top = record.run_id
    mtime = time.time()

    def write(f: IO[bytes]) -> None:
        with tarfile.open(fileobj=f, mode="w:gz") as tar:
            for name, data in {**extra, **out.files}.items():
                info = tarfile.TarInfo(f"{top}/{name}")
                info.size, info.mtime, info.mode = len(data), int(mtime), 0o644
                tar.addfile(info, io.BytesIO(data))

    write_atomic(path, write)
    return Bundle(path=path, files=files, left_out=out.left_out, bytes=path.stat().st_size)
