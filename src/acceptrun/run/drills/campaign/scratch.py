"""The campaign's copies for the kinds that change a run's inputs: never the user's own.

``data_changed`` and ``package_changed`` change something between attempts that
preflight verified: a data file, a package's version. The campaign runs them on a copy of
the spec (:func:`scratch_spec`) whose changed part lies in a scratch folder of the
workspace, marked with :data:`~acceptrun.workload.inject.SCRATCH_MARKER` (the faults
refuse to touch anything without it), and removed after the run:

- ``data_changed``: ``[data] path`` points at a copy of the data (``MAX_DATA_COPY_BYTES``
  at most); the manifest stays the user's, read-only (a manifest kept inside the data is
  read from the copy). The script may read the data from its own path: the fault changes
  the copy, which is what acceptrun verifies, so the restart's refusal is what is scored.
- ``package_changed``: a metadata-only distribution
  (:data:`~acceptrun.workload.inject.SCRATCH_PACKAGE`, version 1.0, no module) in a folder
  put first on the job's ``PYTHONPATH`` through the copy's ``[env]``; provenance lists it
  with every other package of the job's interpreter, and the fault raises its version.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from acceptrun.spec.model import RunSpec, load_spec
from acceptrun.workload.inject import SCRATCH_MARKER, SCRATCH_PACKAGE, SCRATCH_VERSIONS

__all__ = ["MAX_DATA_COPY_BYTES", "SCRATCH_KINDS", "data_copy_problem", "scratch_spec"]

MAX_DATA_COPY_BYTES = 1 << 30  # the data is copied once for the kind: 1 GiB at most
SCRATCH_KINDS = ("data_changed", "package_changed")


def data_copy_problem(spec: RunSpec) -> str | None:
    """Why the campaign cannot change a copy of ``spec``'s data, or None when it can."""
    path = spec.data.path
    if not path or not spec.data.manifest:
        return (
            "the spec verifies no data ([data] path and manifest): there is no verified "
            "data to change; set them (acceptrun data snapshot DATA -o MANIFEST)"
        )
    if "://" in path and not path.startswith("file://"):
        return f"data.path = {path!r} is remote: the campaign changes a local copy only"
    source = Path(spec.resolve_path(path.removeprefix("file://")))
    size = _size(source)
    if size > MAX_DATA_COPY_BYTES:
        return (
            f"data.path {source} holds {size} bytes: the campaign changes a copy, never the "
            f"data itself, and copies {MAX_DATA_COPY_BYTES} bytes at most; drill a spec "
            "with a small sample of the data"
        )
    return None


def _size(source: Path) -> int:
    if source.is_file():
        return source.stat().st_size
    return sum(p.stat().st_size for p in source.rglob("*") if p.is_file())


@contextlib.contextmanager
def scratch_spec(kind: str, spec_path: str | Path, workspace: Path) -> Iterator[Path]:
    """The spec's frozen copy for ``kind`` with its scratch part; all removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=f".campaign-{kind}-", dir=workspace))
    try:
        (folder / SCRATCH_MARKER).write_text(f"acceptrun campaign scratch for {kind}\n")
        spec = load_spec(spec_path)
        if kind == "data_changed":
            _copy_data(spec, folder)
        else:
            _scratch_package(spec, folder)
        path = folder / "spec.toml"
        path.write_text(spec.to_toml(), encoding="utf-8")  # paths resolved: loads from here
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _copy_data(spec: RunSpec, folder: Path) -> None:
    """Point ``[data] path`` at a byte copy in ``folder`` (no link to the user's files)."""
    assert spec.data.path is not None and spec.data.manifest is not None
    source = Path(spec.resolve_path(spec.data.path.removeprefix("file://")))
    manifest = Path(spec.resolve_path(spec.data.manifest))
    copy = folder / source.name
    if source.is_dir():
        shutil.copytree(source, copy, copy_function=shutil.copyfile, symlinks=False)
    else:
        shutil.copyfile(source, copy)
    spec.data.path = str(copy)
    with contextlib.suppress(ValueError):  # a manifest kept inside the data: the copy's
        spec.data.manifest = str(copy / manifest.resolve().relative_to(source.resolve()))


def _scratch_package(spec: RunSpec, folder: Path) -> None:
    """A metadata-only distribution in ``folder/site``, first on the job's PYTHONPATH."""
    site = folder / "site"
    info = site / f"{SCRATCH_PACKAGE.replace('-', '_')}-{SCRATCH_VERSIONS[0]}.dist-info"
    info.mkdir(parents=True)
    (site / SCRATCH_MARKER).write_text("acceptrun campaign scratch package\n")
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {SCRATCH_PACKAGE}\nVersion: {SCRATCH_VERSIONS[0]}\n\n",
        encoding="utf-8",
    )
    before = spec.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    spec.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), before) if p)
