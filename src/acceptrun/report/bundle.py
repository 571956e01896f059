"""The support bundle: one redacted archive of a run, for a provider's support or a colleague.

``acceptrun bundle RUN -o FILE`` gathers what someone away from the machine needs to
judge a failure: provenance, the spec, events, each attempt's exit record and stderr
tail, telemetry and the GPU timeline drawn from it, the verdict, the cost ledger, the
report, and the checkpoints' manifests (never the tensors). Every file is read through
:func:`acceptrun._util.confined.open_regular` from the record (or the checkpoint store):
a symlink, a FIFO, a device or a directory where a file belongs is never followed nor
read, and is listed in ``MANIFEST.json`` under ``not_followed`` by its name and what it
is ("a symbolic link, not followed"), never by its target. Every file passes through
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
import json
import os
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from acceptrun._util.confined import open_regular
from acceptrun._util.durable import (
    MAX_JSONL_LINE_BYTES,
    read_json,
    read_jsonl,
    write_atomic,
)
from acceptrun._util.paths import inside
from acceptrun._util.redact import learn, learn_spec, redact_obj, redact_text
from acceptrun.errors import AcceptrunError, UnsafeFileError, UserError
from acceptrun.notify.secrets import kept_secret_values
from acceptrun.record.models import stamp
from acceptrun.record.workspace import RunRecord, now_iso

__all__ = ["BUNDLE_README", "Bundle", "build_bundle", "check_output"]

TAIL_BYTES = 64 * 1024  # the last 64 KiB of each attempt's stderr: a traceback and its lead-up
CHUNK = 1 << 20  # bytes read at a time from a log or a JSONL file: memory stays bounded
# A damaged JSON file is copied as it is (redacted) up to this size, else left out, said.
MAX_RAW_COPY = 16 << 20
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
    not_followed: list[dict[str, str]] = field(default_factory=list)  # path, what (a link...)
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
    if inside(record.path, path):
        raise UserError(
            f"-o {path}: inside the run's record {record.path}; write the bundle elsewhere, "
            f"e.g. -o {record.run_id}.tar.gz"
        )
    if not path.name.endswith((".tar.gz", ".tgz")):
        raise UserError(f"-o {path}: the bundle is a gzip-compressed tar; name it *.tar.gz")
    return path


def _tail(path: Path, root: Path, limit: int = TAIL_BYTES) -> tuple[str, bool]:
    """The last ``limit`` bytes of a log as text, and whether it was cut."""
    with open_regular(path, root=root) as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - limit))
        data = f.read()
    if size > limit:  # start at a whole line
        data = data[data.find(b"\n") + 1 :] if b"\n" in data else data
    return data.decode("utf-8", "replace"), size > limit


def _json_text(obj: Any) -> str:
    return json.dumps(redact_obj(obj), indent=2, sort_keys=True, default=str) + "\n"


def _blocks(f: IO[bytes], line_limit: int = MAX_JSONL_LINE_BYTES) -> Iterator[str]:
    """An open text file in blocks of whole lines (about CHUNK bytes each), closed at the
    end: a secret never spans lines (every form the redactor knows stops at a line
    break). A line longer than ``line_limit`` (the record readers' own limit) is replaced
    by a line saying so."""
    with f:
        rest, skipping = b"", 0
        while block := f.read(CHUNK):
            if skipping:  # inside an over-long line: drop up to its end
                end = block.find(b"\n")
                if end < 0:
                    skipping += len(block)
                    continue
                yield f"[acceptrun bundle: a line of {skipping + end} bytes left out]\n"
                block, skipping = block[end + 1 :], 0
            block = rest + block
            cut = block.rfind(b"\n") + 1
            if cut == 0:  # no line break yet: read on, up to the limit
                rest = block
                if len(rest) > line_limit:
                    rest, skipping = b"", len(rest)
                continue
            rest = block[cut:]
            yield block[:cut].decode("utf-8", "replace")
        if skipping:
            yield f"[acceptrun bundle: a line of {skipping} bytes left out]\n"
        elif rest:
            yield rest.decode("utf-8", "replace")


class _Writer:
    """Writes the bundle's files, redacted, into a scratch folder, hashing them on the way.

    A file streams through in blocks, so a log of gigabytes never sits in memory; the
    archive is packed from the scratch copies once every file is there.
    """

    def __init__(self, scratch: Path, root: Path) -> None:
        self.scratch = scratch
        self.root = root  # the record: files are read from it, no link below it followed
        self.files: list[dict[str, Any]] = []  # path, bytes, sha256, in the archive's order
        self.holds: list[str] = []
        self.left_out: list[str] = []
        self.not_followed: list[dict[str, str]] = []  # path, what: never read

    def add(self, name: str, text: str | Iterable[str], what: str) -> None:
        """Add ``name`` with ``text`` (or its blocks). One mechanism: every byte of the
        bundle passes redact_text (JSON went through redact_obj first), whatever made it."""
        target = self.scratch / name
        target.parent.mkdir(parents=True, exist_ok=True)
        digest, size = hashlib.sha256(), 0
        with target.open("wb") as f:
            for block in [text] if isinstance(text, str) else text:
                data = redact_text(block).encode()
                digest.update(data)
                size += len(data)
                f.write(data)
        self.files.append({"path": name, "bytes": size, "sha256": digest.hexdigest()})
        self.holds.append(f"  {name}: {what}")

    def refuse(self, name: str, exc: UnsafeFileError) -> None:
        """List a file that is not a regular one of the record by its name and what it is:
        never its content, nor where a link leads (that path may show a home's layout)."""
        self.not_followed.append({"path": name, "what": exc.what})
        self.left_out.append(f"{name}: {exc.what}, not followed")

    def add_file(self, name: str, source: Path, what: str, *, root: Path | None = None) -> None:
        """Add a copy of ``source`` (as written: a damaged line stays evidence), redacted;
        read from ``root`` (default: the record) without following a link."""
        try:
            f = open_regular(source, root=self.root if root is None else root)
        except UnsafeFileError as exc:
            self.refuse(name, exc)
            return
        except OSError as exc:
            self.left_out.append(f"{name}: cannot be read ({exc.strerror or exc})")
            return
        self.add(name, _blocks(f), what)

    def add_json(self, name: str, source: Path, what: str) -> None:
        """Add a record's JSON file, re-written redacted; a damaged one as it is, said so:
        a damaged record is when support needs the bundle most."""
        try:
            self.add(name, _json_text(read_json(source, root=self.root)), what)
        except UnsafeFileError as exc:
            self.refuse(name, exc)
        except (AcceptrunError, OSError) as exc:
            self.damaged(name, source, what, exc)

    def damaged(self, name: str, source: Path, what: str, exc: Exception) -> None:
        if isinstance(exc, UnsafeFileError):
            self.refuse(name, exc)
            return
        why = str(exc).splitlines()[0][:300]
        try:
            size = os.lstat(source).st_size
        except OSError:
            size = None
        if size is not None and size <= MAX_RAW_COPY:
            self.add_file(name, source, f"{what} (DAMAGED, copied as it is: {why})")
        else:
            self.left_out.append(f"{name}: damaged and not copied ({why})")


def _gather(record: RunRecord, out: _Writer, *, include_logs: bool) -> None:
    from acceptrun.spec.load import MAX_TOML_BYTES, loads_toml

    # The values of its secret fields (a webhook URL), which its frozen spec leaves out,
    # are hidden wherever the workload printed them too.
    learn(kept_secret_values(record))
    try:
        # its [env] secrets are hidden wherever the workload printed them
        learn_spec(loads_toml(record.read_text("spec.toml", MAX_TOML_BYTES)))
        out.add_file("spec.toml", record.spec_path, _WHAT["spec.toml"])
    except (AcceptrunError, OSError, ValueError) as exc:  # ValueError: too large, not UTF-8
        out.damaged("spec.toml", record.spec_path, _WHAT["spec.toml"], exc)
    # lexists, not is_file: a link (even a dangling one) is listed as not followed.
    for name in RECORD_JSON:
        p = record.file(name)
        if os.path.lexists(p):
            out.add_json(name, p, _WHAT[name])
        else:
            out.left_out.append(f"{name}: not in the record (this run wrote none)")
    for name in RECORD_JSONL:
        if os.path.lexists(record.file(name)):
            out.add_file(name, record.file(name), _WHAT[name])
    if record.telemetry_path.is_file() and not record.telemetry_path.is_symlink():
        gpu = (
            json.dumps(x, sort_keys=True, default=str) + "\n"
            for x in read_jsonl(record.telemetry_path, root=record.path)
            if x.get("kind") in GPU_KINDS
        )
        out.add("gpu_timeline.jsonl", gpu, _WHAT["gpu_timeline.jsonl"])
    else:
        out.left_out.append("gpu_timeline.jsonl: the run recorded no telemetry to draw it from")
    _ledger(record, out)
    if os.path.lexists(record.file("report.html")):
        out.add_file("report.html", record.file("report.html"), _WHAT["report.html"])
    _attempts(record, out, include_logs=include_logs)
    _manifests(record, out)
    out.left_out += [
        "checkpoint tensors and optimizer state: only their manifests (names, sizes, digests)",
        "outputs (models, files the run registered): their names and sizes are in events.jsonl",
        "the step log (attempts/<n>/steps, binary): its curves are in report.html",
        "the workdir and the code: provenance.json names the git commit",
    ]


def _ledger(record: RunRecord, out: _Writer) -> None:
    from acceptrun.cost.catalog import load_catalog
    from acceptrun.cost.report import ledger_for

    try:
        ledger = ledger_for(record, load_catalog(record.path.parent.parent))
    except (AcceptrunError, OSError, ValueError) as exc:  # the bundle still goes out, says why
        out.left_out.append(f"ledger.json: could not be built ({exc})")
        return
    out.add("ledger.json", _json_text(ledger), _WHAT["ledger.json"])


def _attempts(record: RunRecord, out: _Writer, *, include_logs: bool) -> None:

    root = record.path / "attempts"
    numbers = (
        sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []
    )
    for n in numbers:
        d = record.attempt_dir(n)
        for name in ATTEMPT_JSON:
            if os.path.lexists(d / name):
                what = (
                    "how the attempt ended: class, evidence, work lost"
                    if name == "exit.json"
                    else "its processes"
                )
                out.add_json(f"attempts/{n}/{name}", d / name, what)
        err = d / "stderr.log"
        if os.path.lexists(err):
            try:
                text, cut = _tail(err, record.path)
            except UnsafeFileError as exc:
                out.refuse(f"attempts/{n}/stderr.log", exc)
            except OSError as exc:
                out.left_out.append(f"attempts/{n}/stderr.log: cannot be read ({exc.strerror})")
            else:
                what = (
                    f"the last {TAIL_BYTES // 1024} KiB of stderr" if cut else "the whole of stderr"
                )
                out.add(f"attempts/{n}/stderr.tail.log", text, what)
        if include_logs:
            for name in ("stdout.log", "stderr.log"):
                if os.path.lexists(d / name) and not any(
                    r["path"] == f"attempts/{n}/{name}" for r in out.not_followed
                ):
                    what = f"the whole {name} (--include-logs)"
                    out.add_file(f"attempts/{n}/{name}", d / name, what)
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
    except (AcceptrunError, OSError, ValueError) as exc:
        out.left_out.append(f"checkpoint manifests: the store was not found ({exc})")
        return
    found = sorted(root.glob(f"*/{MANIFEST}")) if root.is_dir() else []
    # No link below the record (a store inside it), or below a store outside it, is followed.
    confined = record.path if root.is_relative_to(record.path) else root
    for p in found:
        out.add_file(
            f"checkpoints/{p.parent.name}/{MANIFEST}",
            p,
            "a checkpoint's manifest: its files, sizes and digests (no tensors)",
            root=confined,
        )
    if not found:
        out.left_out.append("checkpoint manifests: the run left no checkpoint in its store")


def build_bundle(record: RunRecord, path: Path, *, include_logs: bool = False) -> Bundle:
    """Write the support bundle of ``record`` to ``path`` (a ``.tar.gz``), durably.

    The redacted copies go to a scratch folder beside ``path`` (removed afterwards), so a
    large log costs disk there, never memory. Example:
    ``build_bundle(ws.get_run("latest"), Path("run.tar.gz")).files``.
    """
    from acceptrun._version import __version__

    try:
        state = record.state
    except (AcceptrunError, OSError):  # run.json damaged: the bundle copies it, says so
        state = {}
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.scratch-", dir=path.parent) as tmp:
        out = _Writer(Path(tmp) / "files", record.path)
        _gather(record, out, include_logs=include_logs)
        manifest = {
            **stamp(),
            "run_id": record.run_id,
            "name": state.get("name"),
            "made_at": now_iso(),
            "include_logs": include_logs,
            "files": out.files,
            "left_out": out.left_out,
            "not_followed": out.not_followed,
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
        extra = Path(tmp) / "extra"
        extra.mkdir()
        (extra / "README.txt").write_bytes(redact_text(readme).encode())
        (extra / "MANIFEST.json").write_bytes(_json_text(manifest).encode())
        sums = "".join(f"{f['sha256']}  {f['path']}\n" for f in out.files)
        (extra / "SHA256SUMS").write_bytes(sums.encode())
        mtime = int(time.time())
        members = [(extra / n, n) for n in ("README.txt", "MANIFEST.json", "SHA256SUMS")]
        members += [(out.scratch / f["path"], f["path"]) for f in out.files]

        def write(f: IO[bytes]) -> None:
            with tarfile.open(fileobj=f, mode="w:gz") as tar:
                for source, name in members:
                    info = tarfile.TarInfo(f"{record.run_id}/{name}")
                    info.size, info.mtime, info.mode = source.stat().st_size, mtime, 0o644
                    with source.open("rb") as data:
                        tar.addfile(info, data)

        write_atomic(path, write)
    return Bundle(
        path=path, files=out.files, left_out=out.left_out, not_followed=out.not_followed,
        bytes=path.stat().st_size,
    )  # fmt: skip
