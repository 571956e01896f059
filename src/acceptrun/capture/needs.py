"""What this spec needs installed, where it runs, checked before the first step.

A feature either works with the install that enabled it or the run is refused before any
compute (preflight's ``dependencies`` check). Each need names the feature that asks for
it, the module, the extra of acceptrun that installs it, and the interpreter it must be
importable in: acceptrun's own (the supervisor reads TensorBoard logs and mirrors watched
checkpoints) and the workload's (the client API mirrors the checkpoints it commits).
Restoring a checkpoint needs nothing the save did not: acceptrun reads and writes the
safetensors format itself (checkpoint/state.py).

The workload's interpreter is asked through the package list provenance already took of
it (``packages.list``), so this check starts no process of its own.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from typing import Any

from acceptrun.spec.model import RunSpec

__all__ = ["Need", "check_needs", "needs_of"]

# module -> the extra of acceptrun that installs it (pyproject.toml)
EXTRAS = {"s3fs": "s3", "tensorboard": "tensorboard", "mlflow": "mlflow"}

# fsspec protocols a mirror URL may name that need no package beyond fsspec itself
_BUILTIN = frozenset({"", "file", "local", "memory"})


@dataclass(frozen=True)
class Need:
    feature: str  # the spec field that asks for it: "checkpoint.mirror = 's3://b/x'"
    module: str  # the top-level module to import: "s3fs"
    where: tuple[str, ...]  # "acceptrun" (this interpreter), "workload"

    @property
    def fix(self) -> str:
        extra = EXTRAS.get(self.module)
        return f"pip install 'acceptrun[{extra}]'" if extra else f"pip install {self.module}"


def _protocol(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def _fsspec_module(protocol: str) -> str | None:
    """The module fsspec imports for ``protocol`` (``s3`` -> ``s3fs``); None: built in."""
    if protocol in _BUILTIN:
        return None
    from fsspec.registry import known_implementations

    known = known_implementations.get(protocol)
    if known is None:
        return None  # an unknown protocol: the spec's own check names it
    return str(known["class"]).split(".", 1)[0]


def needs_of(spec: RunSpec) -> list[Need]:
    """Everything the spec's features need installed, with where they run."""
    out: list[Need] = []
    mirror = spec.checkpoint.mirror
    if mirror:
        module = _fsspec_module(_protocol(mirror))
        if module and module != "fsspec":
            out.append(Need(f"checkpoint.mirror = {mirror!r}", module, ("acceptrun", "workload")))
    if spec.progress.tensorboard is not None:
        out.append(Need("progress.tensorboard", "tensorboard", ("acceptrun",)))
    return out


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def check_needs(
    spec: RunSpec, prov: dict[str, Any], python: str | None, how: str = ""
) -> tuple[bool, str, dict[str, Any]]:
    """Preflight's ``dependencies`` check: every need importable where it runs.

    ``python`` is the workload's interpreter (None: not a Python program, nothing of
    acceptrun's runs inside it), found as ``how`` says (``the command's "python", found
    on PATH``); its packages are provenance's list of them.
    """
    packages = (prov.get("packages") or {}).get("list")
    workload = packages if isinstance(packages, dict) and python else None
    missing: list[str] = []
    fixes: list[str] = []
    checked: list[dict[str, Any]] = []
    for need in needs_of(spec):
        for where in need.where:
            if where == "acceptrun":
                found = importlib.util.find_spec(need.module) is not None
                place = f"acceptrun's interpreter ({sys.executable})"
            elif workload is None:
                continue
            else:
                found = _normal(need.module) in {_normal(n) for n in workload}
                place = f"the workload's interpreter ({python}" + (f", {how})" if how else ")")
            checked.append({"feature": need.feature, "module": need.module,
                            "where": where, "found": found})  # fmt: skip
            if not found:
                missing.append(f"{need.feature} needs {need.module}, not installed in {place}")
                fix = need.fix + (f" (with {python} -m pip)" if where == "workload" else "")
                if fix not in fixes:
                    fixes.append(fix)
    details: dict[str, Any] = {"checked": checked}
    if missing:
        details["fix"] = "; ".join(fixes)
        return False, "; ".join(missing) + f": {details['fix']}", details
    if not checked:
        return True, "nothing beyond acceptrun's own dependencies", details
    names = sorted({f"{c['module']} ({c['where']})" for c in checked})
    return True, "installed: " + ", ".join(names), details
