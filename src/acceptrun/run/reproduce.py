"""``acceptrun reproduce RUN``: run a recorded run again, from its frozen spec and its code.

The new run starts from the record's frozen ``spec.toml``. When the checkout's HEAD is
not the recorded commit, the record had uncommitted changes (``git.diff``), or the
checkout has uncommitted changes of its own now, the code is rebuilt in a git worktree
at the recorded commit (``<workspace>/worktrees/<run_id>``) with the recorded diff
applied, and the run's workdir (and any path under the checkout) moves there. The data
and its manifest are the recorded ones, verified again by preflight; seeds come from
the spec's command and env as recorded.

Two things of the frozen spec change, so that the reproduction never touches the
original run: ``checkpoint.dir`` falls back to the new record's own ``checkpoints/``,
and ``checkpoint.mirror`` is dropped (a shared mirror's ``LATEST`` would move). The new
run records ``"reproduces": <run_id>`` in run.json and a ``reproduces`` event.
Compare the two with ``acceptrun diff RUN NEW_RUN``.

>>> result = reproduce(ws, ws.get_run("latest"))   # logs where the code comes from
>>> result.record.state["reproduces"]
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from acceptrun._util import git as gitutil
from acceptrun._util.console import get_logger
from acceptrun._util.durable import write_atomic
from acceptrun.errors import RecordError, UserError
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.spec.model import load_spec

__all__ = ["ReproducePlan", "plan_reproduction", "prepare", "reproduce"]

_log = get_logger(__name__)  # where the code comes from, then the new run's own lines

GIT_TIMEOUT = 300.0  # seconds: a worktree of a large repository takes a while to check out
# Variables of the original environment that steer numerics (threads, allocator, kernels):
# carried into the reproduction's spec env when the spec did not set them.
NUMERIC_ENV_PREFIXES = ("OMP_", "MKL_", "TORCH_", "PYTORCH_")


@dataclass(slots=True)
class ReproducePlan:
    """How a run will be reproduced: where its code comes from, and why."""

    run_id: str
    commit: str | None
    root: Path | None
    """The original checkout (git root), when the run's code was under git."""
    worktree: Path | None
    """Where the code is rebuilt; None runs in the original checkout."""
    apply_diff: bool
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    spec_path: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "of": self.run_id,
            "commit": self.commit,
            "root": str(self.root) if self.root else None,
            "worktree": str(self.worktree) if self.worktree else None,
            "diff_applied": self.apply_diff,
            "reasons": self.reasons,
            "notes": self.notes,
            "spec": str(self.spec_path) if self.spec_path else None,
        }


def _git(root: Path, *args: str, check: bool = True) -> str:
    return gitutil.git(root, *args, check=check, timeout=GIT_TIMEOUT)


def _has_patch(diff: Path) -> bool:
    """True when git.diff holds at least one file change (not only the untracked note)."""
    with open(diff, "rb") as f:
        return any(line.startswith(b"diff --git ") for line in f)


def plan_reproduction(ws: Workspace, record: RunRecord, *, worktree: bool = False) -> ReproducePlan:
    """Decide where the code comes from; reads the record and the checkout, changes nothing."""
    prov = record.read_json("provenance.json")
    if not isinstance(prov, dict):
        raise RecordError(
            f"run {record.run_id} has no provenance.json (it stopped before preflight): "
            "there is no recorded code to reproduce"
        )
    git = prov.get("git") if isinstance(prov.get("git"), dict) else {}
    if not git or git.get("absent"):
        plan = ReproducePlan(record.run_id, None, None, None, False)
        plan.notes.append(
            "the run's code was not under git: the frozen spec runs on the code as it is now"
        )
        return plan
    root = Path(str(git["root"]))
    commit = git.get("commit")
    if not root.is_dir():
        raise UserError(
            f"the checkout of run {record.run_id} ({root}) is not on this machine; "
            f"clone the repository there, or follow `acceptrun howto {record.run_id}`"
        )
    if not commit:
        raise UserError(
            f"run {record.run_id} ran in a repository without commits; nothing to check out"
        )
    diff = record.file("git.diff")
    recorded_dirty = bool(git.get("dirty"))
    apply_diff = recorded_dirty and diff.is_file() and _has_patch(diff)
    if recorded_dirty and not diff.is_file():
        raise RecordError(
            f"run {record.run_id} had uncommitted changes but its git.diff is missing; "
            "its code cannot be rebuilt"
        )
    head = _git(root, "rev-parse", "--verify", "-q", "HEAD", check=False)
    dirty_now = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    reasons = []
    if worktree:
        reasons.append("asked for (--worktree)")
    if head != commit:
        reasons.append(f"HEAD is {head[:12] or 'unborn'}, the run was at {commit[:12]}")
    if apply_diff:
        reasons.append(
            f"the run had uncommitted changes ({git.get('diff_bytes')} bytes of git.diff)"
        )
    if dirty_now:
        reasons.append("the checkout has uncommitted changes now")
    place = ws.root / "worktrees" / record.run_id if reasons else None
    plan = ReproducePlan(record.run_id, str(commit), root, place, apply_diff, reasons)
    untracked = _untracked_names(diff) if diff.is_file() else []
    if untracked:
        plan.notes.append(
            "untracked files were not recorded and are missing from the rebuilt code: "
            + ", ".join(untracked[:5])
            + (f" and {len(untracked) - 5} more" if len(untracked) > 5 else "")
        )
    return plan


def _untracked_names(diff: Path) -> list[str]:
    names = []
    with open(diff, "rb") as f:
        for raw in f:
            if not raw.startswith(b"#"):
                break
            if raw.startswith(b"#   "):
                names.append(raw[4:].decode(errors="replace").rstrip("\n"))
    return names


def _make_worktree(plan: ReproducePlan, record: RunRecord) -> None:
    assert plan.root is not None and plan.worktree is not None and plan.commit is not None
    if _git(plan.root, "cat-file", "-t", plan.commit, check=False) != "commit":
        raise UserError(
            f"commit {plan.commit[:12]} of run {plan.run_id} is not in {plan.root}; "
            "`git fetch` the branch it was on, then reproduce again"
        )
    if plan.worktree.exists():  # left by an earlier reproduction: rebuilt from scratch
        _git(plan.root, "worktree", "remove", "--force", str(plan.worktree), check=False)
        if plan.worktree.exists():
            shutil.rmtree(plan.worktree)
        _git(plan.root, "worktree", "prune", check=False)
    plan.worktree.parent.mkdir(parents=True, exist_ok=True)
    _git(plan.root, "worktree", "add", "--detach", str(plan.worktree), plan.commit)
    if plan.apply_diff:
        diff = record.file("git.diff")
        _git(plan.worktree, "apply", "--binary", "--whitespace=nowarn", str(diff))


def _moved(value: str, plan: ReproducePlan) -> str:
    """A path under the original checkout, moved into the worktree when it exists there."""
    if plan.worktree is None or plan.root is None or not value.startswith("/"):
        return value
    try:
        rel = Path(value).relative_to(plan.root)
    except ValueError:
        return value
    target = plan.worktree / rel
    return str(target) if target.exists() else value


def _spec_data(record: RunRecord, plan: ReproducePlan) -> dict[str, Any]:
    """The frozen spec as data, its paths moved into the worktree, isolated from the run."""
    data = load_spec(record.spec_path).to_dict()
    if plan.worktree is not None and plan.root is not None:
        workdir = Path(str(data.get("workdir", ".")))
        try:
            data["workdir"] = str(plan.worktree / workdir.relative_to(plan.root))
        except ValueError:
            plan.notes.append(f"workdir {workdir} is outside the checkout: it stays as it is")
        data["command"] = [_moved(str(c), plan) for c in data.get("command", [])]
        data["env"] = {k: _moved(str(v), plan) for k, v in (data.get("env") or {}).items()}
        section = data.get("data") or {}
        for key in ("path", "manifest"):
            if isinstance(section.get(key), str):
                section[key] = _moved(section[key], plan)
    ckpt = data.get("checkpoint") or {}
    for key, why in (
        ("dir", "checkpoint.dir: the new run keeps its checkpoints in its own record"),
        ("mirror", "checkpoint.mirror dropped: the original's mirror stays untouched"),
    ):
        if ckpt.pop(key, None) is not None:
            plan.notes.append(why)
    prov = record.read_json("provenance.json") or {}
    raw_env = prov.get("env")
    recorded_env: dict[str, Any] = raw_env if isinstance(raw_env, dict) else {}
    env = data.setdefault("env", {})
    for name, value in sorted(recorded_env.items()):
        if name.startswith(NUMERIC_ENV_PREFIXES) and name not in env and value != "<redacted>":
            env[name] = str(value)
            plan.notes.append(f"env {name}={value} as recorded")
    return data


def prepare(ws: Workspace, record: RunRecord, plan: ReproducePlan) -> Path:
    """Build the worktree (when planned) and write the reproduction's spec; returns its path."""
    if plan.worktree is not None:
        _make_worktree(plan, record)
    data = _spec_data(record, plan)
    spec_path = ws.root / "reproduce" / record.run_id / "spec.toml"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    header = f"# Reproduction of run {record.run_id}, written by `acceptrun reproduce`.\n"
    write_atomic(spec_path, header + tomli_w.dumps(data), raw=True)  # a spec to run
    plan.spec_path = spec_path
    return spec_path


def _mark(path: Path, plan: ReproducePlan) -> None:
    new = RunRecord(path)
    if new.state.get("reproduces") == plan.run_id:
        return
    new.update_state(reproduces=plan.run_id)
    new.event("reproduces", sync=True, **plan.to_dict())


def reproduce(
    ws: Workspace,
    record: RunRecord,
    *,
    worktree: bool = False,
    echo: bool = True,
) -> Any:
    """Run ``record`` again (see the module docstring); returns the new run's LaunchResult."""
    from acceptrun.run.launch import launch

    plan = plan_reproduction(ws, record, worktree=worktree)
    spec_path = prepare(ws, record, plan)
    if plan.worktree is not None:
        _log.info(
            f"code: worktree {plan.worktree} at {str(plan.commit)[:12]} ({'; '.join(plan.reasons)})"
        )
        if plan.apply_diff:
            _log.info("code: the recorded git.diff applied")
    elif plan.commit:
        _log.info(f"code: the checkout {plan.root} at {plan.commit[:12]}, clean")
    for note in plan.notes:
        _log.info(note)
    # Marked as soon as the new record exists, so even a reproduction that is killed
    # says what it reproduces; again at the end, with the finished record.
    result = launch(
        spec_path, workspace=ws.root, echo=echo, on_record=lambda new: _mark(new.path, plan)
    )
    _mark(result.record.path, plan)
    return result
