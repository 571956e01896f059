"""``acceptrun howto RUN``: the commands a second engineer types to repeat a run elsewhere.

Generated from the record alone: the clone URL and commit (provenance), the uncommitted
diff (``git.diff``), the Python and package versions the workload ran with, the data
and the manifest it was verified against, the run command, and the ``acceptrun diff``
that says whether the repeat reproduced it. Where the record cannot say (no remote, data
only on the original machine), the step copies it from the original machine
(``scp``/``rsync`` from the ``user@host`` that ran it) and says why in a comment. So do
files inside the repository that a clone lacks: data that git ignores (checked in the
checkout, when it is on this machine) and a spec or manifest that was not committed.

>>> print(format_howto(ws.get_run("latest")))
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec, load_spec
from acceptrun.verdict.portability_git import GitState, git_state, recorded_states

__all__ = ["format_howto", "howto_steps"]

# Packages that pip cannot install by name from an index: the tool itself (often an
# editable install), and pip's own bootstrap packages.
_SKIP = frozenset({"acceptrun", "pip", "setuptools", "wheel"})


def _part(prov: dict[str, Any], name: str) -> dict[str, Any]:
    part = prov.get(name)
    return part if isinstance(part, dict) and not part.get("absent") else {}


def _rel(path: str | None, root: Path | None) -> str | None:
    if not path or root is None or "://" in path:
        return None
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return None


def _lacking(path: str, root: Path | None, at_run: dict[str, GitState]) -> GitState | None:
    """How a clone lacks ``path``: untracked at run time, or ignored by git; else None."""
    if root is None:
        return None
    recorded = at_run.get(str(Path(path).resolve())) or at_run.get(path)
    if recorded is not None and recorded.state == "untracked":
        return recorded
    now = git_state(path, root)
    return now if now is not None and now.state in ("ignored", "untracked") else None


def _why_lacking(state: GitState) -> str:
    if state.state == "ignored":
        return f"git ignores it ({state.rule or 'a .gitignore rule'}): a clone does not have it"
    return "it was not committed: a clone does not have it"


@dataclass
class _Repeat:
    """What every step reads: the record, its frozen spec and where the original ran."""

    record: RunRecord
    spec: RunSpec
    prov: dict[str, Any]  # provenance.json
    host: str  # user@host: where scp, rsync and git clone copy from
    root: Path | None  # the repository's root at run time
    at_run: dict[str, GitState]  # the git state of the spec's paths at run time


def howto_steps(record: RunRecord) -> list[tuple[str, list[str]]]:
    """(title, shell lines) for each step; comments start with ``#``."""
    prov = record.read_json("provenance.json") or {}
    git = _part(prov, "git")
    root = Path(str(git["root"])) if git.get("root") else None
    r = _Repeat(
        record=record,
        spec=load_spec(record.spec_path),
        prov=prov,
        host=str(record.state.get("created_by") or "user@original-host"),
        root=root,
        at_run=recorded_states(record, root) if root is not None else {},
    )
    steps = [
        ("the original machine", _machine(r)),
        ("the code at the recorded commit", _code(r)),
        ("the same Python and packages", _environment(r)),
    ]
    if r.spec.data.path:
        steps.append(
            ("the data, checked against the manifest the run used", _data(r, r.spec.data.path))
        )
    steps.append(("the run", _run(r)))
    steps.append(("compare with the original", _compare(r)))
    return steps


def _machine(r: _Repeat) -> list[str]:
    python, torch, gpus = _part(r.prov, "python"), _part(r.prov, "torch"), _part(r.prov, "gpus")
    machine = [f"# run {r.record.run_id} ({r.spec.name}), started by {r.host}"]
    if python:
        machine.append(f"# Python {python.get('version')} ({python.get('implementation')})")
    if torch:
        machine.append(
            f"# torch {torch.get('version')}, CUDA {torch.get('cuda') or 'none'}, "
            f"cuDNN {torch.get('cudnn') or 'none'}, NCCL {torch.get('nccl') or 'none'}"
        )
    if gpus.get("devices"):
        names = sorted({str(d.get("name")) for d in gpus["devices"]})
        machine.append(
            f"# {gpus.get('count')} x {', '.join(names)}, driver {gpus.get('driver')} "
            f"(CUDA {gpus.get('cuda_driver')})"
        )
    else:
        machine.append("# no NVIDIA GPU was recorded (a CPU run, or NVML was missing)")
    machine.append("# Check the new machine against it once step 2 is done: `acceptrun env`")
    return machine


def _code(r: _Repeat) -> list[str]:
    git, q, name = _part(r.prov, "git"), shlex.quote, r.spec.name
    host, root, record = r.host, r.root, r.record
    code: list[str] = []
    if not git:
        code += [
            "# the code was not under git: copy the working directory as it is now",
            f"rsync -a {q(host + ':' + str(r.spec.workdir_path))}/ {q(name)}/",
            f"cd {q(name)}",
        ]
    else:
        commit = str(git.get("commit") or "")
        if git.get("remote"):
            code.append(f"git clone {q(str(git['remote']))} {q(name)}")
        else:
            code += [
                "# no remote was recorded: clone the repository from the original machine",
                f"git clone {q(host + ':' + str(root))} {q(name)}",
            ]
        code += [f"cd {q(name)}", f"git checkout --detach {commit}"]
        if git.get("dirty") and int(git.get("diff_bytes") or 0) > 0:
            code += [
                f"# the run had uncommitted changes ({git.get('diff_bytes')} bytes): apply them",
                f"scp {q(host + ':' + str(record.file('git.diff')))} /tmp/{record.run_id}.git.diff",
                f"git apply --binary /tmp/{record.run_id}.git.diff",
            ]
    return code


def _environment(r: _Repeat) -> list[str]:
    python, packages = _part(r.prov, "python"), _part(r.prov, "packages")
    q, record = shlex.quote, r.record
    env: list[str] = []
    version = str(python.get("version") or "3")
    major_minor = ".".join(version.split(".")[:2])
    env.append(f"python{major_minor} -m venv .venv && . .venv/bin/activate")
    pins = {k: v for k, v in sorted((packages.get("list") or {}).items()) if k.lower() not in _SKIP}
    if pins:
        req = f"/tmp/{record.run_id}.requirements.txt"
        env.append(f"cat > {req} <<'EOF'")
        env += [f"{k}=={v}" for k, v in pins.items()]
        env.append("EOF")
        extra = ""
        torch_version = str(pins.get("torch") or "")
        if "+" in torch_version:  # a local build tag (+cu124, +cpu): PyTorch's own index
            extra = f" --extra-index-url https://download.pytorch.org/whl/{torch_version.split('+', 1)[1]}"
        env.append(f"pip install -r {req}{extra}")
    else:
        env.append("# no package list was recorded: install what the project's README says")
    tool = (packages.get("list") or {}).get("acceptrun")
    env.append(
        f"pip install {q('acceptrun==' + tool) if tool else 'acceptrun'}  # or from its source"
    )
    return env


def _data(r: _Repeat, data_path: str) -> list[str]:
    spec, root, at_run = r.spec, r.root, r.at_run
    host, q, record = r.host, shlex.quote, r.record
    data: list[str] = []
    path = spec.resolve_path(data_path)
    manifest = spec.resolve_path(spec.data.manifest) if spec.data.manifest else None
    rel_data, rel_manifest = _rel(path, root), _rel(manifest, root)
    if "://" in path:
        data.append(f"# the data is at {path}: give this machine read access to it")
        here_data = path
    elif rel_data is not None and (lacking := _lacking(path, root, at_run)) is not None:
        here_data = rel_data
        data += [
            f"# the data is inside the repository at {rel_data}, but {_why_lacking(lacking)}",
            "# copy it from the original machine (better: object storage, see "
            f"`acceptrun portability {record.run_id}`)",
            f"mkdir -p {q(str(Path(rel_data).parent))}",
            f"rsync -a {q(host + ':' + path)} {q(str(Path(rel_data).parent))}/",
        ]
    elif rel_data is not None:
        data.append(f"# the data is in the repository at {rel_data}")
        here_data = rel_data
    else:
        here_data = path
        data += [
            "# the data is on the original machine only: copy it (same path here)",
            f"mkdir -p {q(str(Path(path).parent))}",
            f"rsync -a {q(host + ':' + path)} {q(str(Path(path).parent))}/",
        ]
    if manifest:
        here_manifest = rel_manifest or manifest
        if rel_manifest is None and "://" not in manifest:
            data.append(f"scp {q(host + ':' + manifest)} {q(manifest)}")
        elif rel_manifest is not None and (gone := _lacking(manifest, root, at_run)):
            data += [
                f"# the manifest {rel_manifest} is in the repository, but {_why_lacking(gone)}",
                f"scp {q(host + ':' + manifest)} {q(rel_manifest)}",
            ]
        data.append(f"acceptrun data verify {q(here_data)} {q(here_manifest)}")
    else:
        data.append("# the spec has no data manifest: nothing can prove the copy is the same")
    return data


def _run(r: _Repeat) -> list[str]:
    root, at_run, host = r.root, r.at_run, r.host
    q, record = shlex.quote, r.record
    run: list[str] = []
    source = record.state.get("spec_source")
    rel_spec = _rel(str(source), root) if source else None
    spec_lacking = _lacking(str(source), root, at_run) if rel_spec is not None else None
    if rel_spec is not None and spec_lacking is None:
        run.append(f"acceptrun run {q(rel_spec)}")
    else:
        where = (
            f"the spec {rel_spec} is in the repository, but {_why_lacking(spec_lacking)}"
            if spec_lacking is not None
            else "the spec was outside the repository"
        )
        run += [
            f"# {where}: use the frozen copy from the record",
            f"scp {q(host + ':' + str(record.spec_path))} {record.run_id}.spec.toml",
            "# its paths are the original machine's: `acceptrun portability "
            f"{record.run_id}.spec.toml` lists them",
            f"acceptrun run {record.run_id}.spec.toml",
        ]
    return run


def _compare(r: _Repeat) -> list[str]:
    q, record = shlex.quote, r.record
    return [
        "# bring the original record into this workspace, then diff the two runs",
        "mkdir -p .acceptrun/runs",
        f"rsync -a {q(r.host + ':' + str(record.path))} .acceptrun/runs/",
        "acceptrun index rebuild",
        f"acceptrun diff {record.run_id} latest",
    ]


def format_howto(record: RunRecord) -> str:
    """The steps as one shell script with numbered sections."""
    lines = [f"# How to repeat run {record.run_id} on another machine (acceptrun howto)"]
    for i, (title, body) in enumerate(howto_steps(record)):
        lines.append("")
        lines.append(f"# {i}. {title}" if i else f"# {title}")
        lines += body
    return "\n".join(lines)
