"""The acceptrun a remote machine installs: the one that wrote the task.

A task exported here runs ``acceptrun`` on a machine that has none: what it installs
there must be this acceptrun, not whatever a package index holds under its name (none
may). :func:`this_acceptrun` says where this one comes from:

- a **source checkout** (``pip install -e .``, or ``src/`` on the path): the tree itself,
  which SkyPilot uploads and pip builds on the machine;
- an **installed wheel** (the README's install): the distribution's own files, listed with
  their hashes in its ``RECORD``, packed back into a wheel by :func:`pack_wheel`, byte for
  byte what the user installed. A file changed since the install (its hash no longer the
  one ``RECORD`` holds) is refused, naming the file: the task would ship code that is not
  the release it says it is.

The wheel is written once per content into ``<cache>/wheels/<hash>/`` (the cache of
:func:`acceptrun.capture.provenance.cache_dir`); its name follows the wheel naming rules
(PEP 427), so pip installs it as it would the original.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from acceptrun._util.durable import write_atomic
from acceptrun._version import __version__
from acceptrun.capture.provenance import acceptrun_checkout, cache_dir
from acceptrun.errors import UserError

__all__ = ["Shipped", "build_wheel", "pack_wheel", "this_acceptrun", "write_wheel"]

DIST = "acceptrun"
# Files an installer adds to a distribution's .dist-info: they are not part of the wheel.
_INSTALLER_FILES = frozenset({"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"})
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed zip times: the same files give the same wheel


@dataclass(frozen=True, slots=True)
class Shipped:
    """Where this acceptrun comes from: ``source`` (a checkout's tree) or ``wheel``."""

    kind: str
    path: Path
    version: str


def this_acceptrun() -> Shipped:
    """This acceptrun as something a remote machine can install (see the module's text)."""
    root = acceptrun_checkout()
    if root is not None:
        return Shipped("source", root, __version__)
    here = Path(__file__).resolve().parents[1]  # the acceptrun package
    try:
        dist = importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(
            f"acceptrun runs from {here}, which is neither a source checkout nor an "
            "installed distribution; install it (python -m pip install ./acceptrun) and "
            "export again"
        ) from None
    installed = Path(str(dist.locate_file(DIST))).resolve()
    if installed != here:
        raise UserError(
            f"acceptrun runs from {here}, but the installed acceptrun {dist.version} is at "
            f"{installed}: the task would install the other one; run the acceptrun you "
            "mean to ship (its environment's `acceptrun`) and export again"
        )
    wheel = write_wheel(dist)
    return Shipped("wheel", wheel, dist.version)


def pack_wheel(dist: importlib.metadata.Distribution) -> tuple[str, bytes]:
    """The wheel's file name and bytes, from an installed distribution's own files.

    Every file comes from the distribution's ``RECORD`` and must still have the hash it
    lists; compiled caches, the console scripts (made again at install) and the
    installer's own files stay out, and a new ``RECORD`` is written.
    """
    files = dist.files
    if not files:
        raise UserError(
            f"the installed acceptrun {dist.version} lists no files (no RECORD in its "
            ".dist-info); reinstall it with pip and export again"
        )
    text = dist.read_text("direct_url.json")
    if text and json.loads(text).get("dir_info", {}).get("editable"):
        raise UserError(
            f"acceptrun {dist.version} is an editable install whose source is not beside "
            "it; install it normally (python -m pip install ./acceptrun) and export again"
        )
    wheel_meta = dist.read_text("WHEEL") or ""
    tags = [ln.split(":", 1)[1].strip() for ln in wheel_meta.splitlines() if ln.startswith("Tag:")]
    if len(tags) != 1:
        raise UserError(
            f"the installed acceptrun {dist.version}'s WHEEL file names {len(tags)} tags, "
            "not one; reinstall it with pip and export again"
        )
    info_dir = next(
        (str(f).split("/")[0] for f in files if str(f).endswith(".dist-info/WHEEL")), None
    )
    if info_dir is None:
        raise UserError(f"the installed acceptrun {dist.version} has no .dist-info/WHEEL")
    entries: list[tuple[str, bytes]] = []
    for f in sorted(files, key=str):
        name = str(f)
        if name.startswith("..") or "__pycache__" in f.parts or name.endswith(".pyc"):
            continue
        if name.startswith(info_dir + "/") and f.name in _INSTALLER_FILES:
            continue
        path = Path(str(f.locate()))
        data = path.read_bytes()
        if f.hash is not None:
            digest = hashlib.new(f.hash.mode, data).digest()
            if _b64(digest) != f.hash.value:
                raise UserError(
                    f"{path} changed since acceptrun {dist.version} was installed (its hash "
                    "is not the one its RECORD lists): the task would ship code that is not "
                    "that release; reinstall acceptrun (python -m pip install --force-reinstall "
                    "...) and export again"
                )
        entries.append((name, data))
    record = [f"{n},sha256={_b64(hashlib.sha256(d).digest())},{len(d)}" for n, d in entries]
    record.append(f"{info_dir}/RECORD,,")
    entries.append((f"{info_dir}/RECORD", ("\n".join(record) + "\n").encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    version = dist.version.replace("-", "_")
    return f"{DIST}-{version}-{tags[0]}.whl", buf.getvalue()


def write_wheel(dist: importlib.metadata.Distribution, into: Path | None = None) -> Path:
    """:func:`pack_wheel`'s wheel on disk: ``into`` or ``<cache>/wheels/<hash>/``; kept."""
    name, data = pack_wheel(dist)
    folder = (
        into if into is not None else cache_dir() / "wheels" / hashlib.sha256(data).hexdigest()[:16]
    )
    path = folder / name
    if not (path.is_file() and path.read_bytes() == data):
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data, raw=True)
    return path


def build_wheel(into: Path) -> Path:
    """This acceptrun's wheel in ``into``: packed from the install, or built from the checkout."""
    shipped = this_acceptrun()
    if shipped.kind == "wheel":
        return write_wheel(importlib.metadata.distribution(DIST), into)
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=into, prefix=".building-") as tmp:
        # pip builds a directory in place (build/, *.egg-info): build a copy of what the
        # package is made of, so that the checkout gets no file it did not have.
        source, out = Path(tmp) / "source", Path(tmp) / "out"
        source.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if (shipped.path / name).is_file():
                shutil.copy2(shipped.path / name, source / name)
        shutil.copytree(
            shipped.path / "src" / DIST, source / "src" / DIST,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
        )  # fmt: skip
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        built = sorted(out.glob(f"{DIST}-*.whl"))
        if done.returncode != 0 or len(built) != 1:
            raise UserError(
                f"building acceptrun's wheel from {shipped.path} failed (`{' '.join(cmd)}` "
                f"exited {done.returncode}): {(done.stderr or done.stdout).strip()[-800:]}"
            )
        final = into / built[0].name
        os.replace(built[0], final)
    return final


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
