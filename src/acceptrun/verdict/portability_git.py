"""Portability's reading of the code: what a clone of the checkout lacks, and a run's code.

A file git ignores or does not hold (:func:`git_state`, now; :func:`recorded_states`, as the
run's ``git.diff`` recorded it), the run's script untracked, its ``git.diff`` missing or
changed, no remote, and the torch build provenance recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acceptrun._util.git import run_git
from acceptrun._util.hashing import hash_file
from acceptrun.errors import GitError
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec
from acceptrun.verdict.portability_rules import BLOCKER, NOTE, WARNING, Finding, command_tokens

__all__ = [
    "GitState",
    "build_findings",
    "checkout_of",
    "code_findings",
    "committed_findings",
    "git_data_findings",
    "git_state",
    "recorded_states",
    "state_of",
]


@dataclass(frozen=True, slots=True)
class GitState:
    """What git holds of a file or directory in a checkout, as ``git status`` tells it."""

    state: str
    """``committed``, ``modified``, ``untracked`` or ``ignored`` (the clone lacks some of it)."""
    rel: str
    """The path relative to the checkout's root."""
    rule: str | None = None
    """For ``ignored``: the rule that ignores it, ``.gitignore:3:data/``."""
    in_diff: bool = False
    """Read from a run's ``git.diff``: a modified file's changes travel with the record."""


def checkout_of(directory: Path) -> Path | None:
    """The root of the git checkout holding ``directory``, or None."""
    for d in (directory, *directory.parents):
        if (d / ".git").exists():
            return d
    return None


def _git_out(root: Path, *args: str) -> str | None:
    """git's output, or None when git could not answer (1 is an answer: check-ignore's "no")."""
    try:
        res = run_git(root, *args)
    except GitError:
        return None
    return res.stdout if res.returncode in (0, 1) else None


def git_state(path: str | Path, root: Path) -> GitState | None:
    """What a clone of the checkout at ``root`` has of ``path`` now; None when unknown.

    Unknown: the checkout is not on this machine, ``path`` is outside it or missing, or
    git cannot answer. ``ignored`` wins over the others: a clone lacks those files.

    >>> git_state("data", Path(".")).state
    'ignored'
    """
    if not (root / ".git").exists():
        return None
    try:
        target = Path(path).resolve()
        rel = target.relative_to(root.resolve()).as_posix()
    except (OSError, ValueError):
        return None
    if not target.exists() or rel == ".":
        return None
    status = _git_out(
        root, "status", "--porcelain=v1", "--ignored=matching", "--untracked-files=all", "--", rel
    )
    tracked = _git_out(root, "ls-files", "--", rel)
    if status is None or tracked is None:
        return None
    # git lists ignored directories whatever the pathspec: keep the entries at, under or
    # above ``rel`` (an ignored "data/" holds "data/train").
    entries = [
        (line[:2], line[3:].strip().strip('"').rstrip("/"))
        for line in status.splitlines()
        if line.strip()
    ]
    entries = [
        (code, p) for code, p in entries
        if p == rel or p.startswith(rel + "/") or rel.startswith(p + "/")
    ]  # fmt: skip
    codes = {code for code, _ in entries}
    if "!!" in codes:
        found = (_git_out(root, "check-ignore", "-v", "--", rel) or "").strip()
        if not found:  # a file below it is ignored: name that one's rule
            first = next(p for code, p in entries if code == "!!")
            found = (_git_out(root, "check-ignore", "-v", "--", first) or "").strip()
        rule = found.split("\t", 1)[0] if found else None
        return GitState("ignored", rel, rule)
    if not tracked.strip():
        return GitState("untracked", rel)
    if codes:
        return GitState("modified", rel)
    return GitState("committed", rel)


def recorded_states(record: RunRecord, root: Path) -> dict[str, GitState]:
    """Files the run's ``git.diff`` shows as untracked or changed, by absolute path.

    What was uncommitted when the run started, from the record alone.
    """
    out: dict[str, GitState] = {}
    for rel in _untracked(record):
        out[str(root / rel)] = GitState("untracked", rel)
    path = record.file("git.diff")
    if path.is_file():
        with open(path, "rb") as f:
            for raw in f:
                if raw.startswith(b"diff --git a/"):
                    rel = raw.decode(errors="replace").split(" b/", 1)[0][len("diff --git a/") :]
                    out.setdefault(str(root / rel), GitState("modified", rel))
    return out


def committed_findings(what: str, path: str, state: GitState | None) -> list[Finding]:
    """A spec or data manifest that a clone lacks or has in another version."""
    if state is None or state.state == "committed":
        return []
    where = {"spec": "spec", "manifest": "data.manifest"}[what]
    noun = {"spec": "the spec", "manifest": "the data manifest"}[what]
    if state.state == "modified" and state.in_diff:
        return [
            Finding(NOTE, "code", where, state.rel,
                    f"{noun} had uncommitted changes: they travel in the record's git.diff, "
                    "a clone at the commit alone has another version",
                    f"`git add {state.rel} && git commit`, and push")
        ]  # fmt: skip
    if state.state == "modified":
        return [
            Finding(WARNING, "code", where, state.rel,
                    f"{noun} has uncommitted changes: a clone at the commit has another version",
                    f"`git add {state.rel} && git commit`, and push")
        ]  # fmt: skip
    if state.state == "ignored":
        return [
            Finding(WARNING, "code", where, state.rel,
                    f"git ignores {noun} ({state.rule or 'a .gitignore rule'}): a clone lacks it",
                    f"`git add -f {state.rel} && git commit`, or drop the rule")
        ]  # fmt: skip
    return [
        Finding(WARNING, "code", where, state.rel,
                f"{noun} is not committed (untracked): a clone lacks it",
                f"`git add {state.rel} && git commit`, and push")
    ]  # fmt: skip


def git_data_findings(
    spec: RunSpec, root: Path, at_run: dict[str, GitState] | None
) -> list[Finding]:
    """Data and manifest inside the checkout that a clone would not have.

    ``at_run``: a run's files as its ``git.diff`` recorded them; None for a spec file.
    """
    out: list[Finding] = []
    if spec.data.path and "://" not in spec.data.path:
        path = spec.resolve_path(spec.data.path)
        state = git_state(path, root)
        if state is not None and state.state == "ignored":
            rule = state.rule or "a .gitignore rule"
            out.append(
                Finding(WARNING, "data", "data.path", state.rel,
                        f"the data is inside the repository but git ignores it ({rule}): "
                        "another engineer's clone does not have it",
                        "copy it to object storage and point data.path at the URL (the manifest "
                        f"proves the copy is the same), or commit it with `git add -f {state.rel}` "
                        "if it is small")
            )  # fmt: skip
        elif state is not None and state.state == "untracked":
            out.append(
                Finding(WARNING, "data", "data.path", state.rel,
                        "the data is inside the repository but not committed: a clone lacks it",
                        f"`git add {state.rel} && git commit`, or copy it to object storage and "
                        "point data.path at the URL")
            )  # fmt: skip
    if spec.data.manifest and "://" not in spec.data.manifest:
        manifest = spec.resolve_path(spec.data.manifest)
        out += committed_findings("manifest", manifest, state_of(manifest, root, at_run))
    return out


def state_of(path: str, root: Path, at_run: dict[str, GitState] | None) -> GitState | None:
    """For a run (``at_run``): as ``git.diff`` recorded it, else ignored now; else as now."""
    if at_run is None:
        return git_state(path, root)
    recorded = at_run.get(str(Path(path).resolve())) or at_run.get(path)
    if recorded is not None:
        return GitState(recorded.state, recorded.rel, recorded.rule, in_diff=True)
    now = git_state(path, root)  # git.diff does not list ignored files
    return now if now is not None and now.state == "ignored" else None


# ---- code and build (runs only) ------------------------------------------------------------


def _untracked(record: RunRecord) -> list[str]:
    """Untracked files named in the header of git.diff (see provenance: not in the diff)."""
    path = record.file("git.diff")
    if not path.is_file():
        return []
    names: list[str] = []
    with open(path, "rb") as f:
        for raw in f:
            line = raw.decode(errors="replace").rstrip("\n")
            if not line.startswith("#"):
                break
            if line.startswith("#   "):
                names.append(line[4:])
    return names


def code_findings(record: RunRecord, spec: RunSpec, git: dict[str, Any]) -> list[Finding]:
    if not git or git.get("absent"):
        why = str(git.get("reason", "no git information recorded")) if git else "no provenance"
        return [
            Finding(WARNING, "code", "provenance.git", "(none)",
                    f"the code is not under git ({why}): nobody can fetch this exact code",
                    "put the code in a git repository, commit, push, and run again")
        ]  # fmt: skip
    out: list[Finding] = []
    root = Path(str(git.get("root")))
    if not git.get("remote"):
        out.append(
            Finding(WARNING, "code", "provenance.git.remote", "(none)",
                    "the repository has no remote: the commit exists on this machine only",
                    "`git remote add origin URL && git push origin HEAD`")
        )  # fmt: skip
    if git.get("dirty"):
        diff = record.file("git.diff")
        if not git.get("diff_file") or not diff.is_file():
            out.append(
                Finding(BLOCKER, "code", "git.diff", "(missing)",
                        "the working tree had uncommitted changes and the record has no git.diff",
                        "commit the changes and run again")
            )  # fmt: skip
        elif git.get("diff_hash") and hash_file(diff)[0] != git["diff_hash"]:
            out.append(
                Finding(BLOCKER, "code", "git.diff", str(diff),
                        "git.diff no longer matches the hash provenance recorded",
                        "commit the changes and run again; this record's code cannot be rebuilt")
            )  # fmt: skip
        elif int(git.get("diff_bytes") or 0) > 0:
            out.append(
                Finding(NOTE, "code", "git.diff", f"{git.get('diff_bytes')} bytes",
                        "uncommitted changes travel as git.diff in the record",
                        "commit them, so a clone at the commit is the code that ran")
            )  # fmt: skip
    untracked = _untracked(record)
    named = set()
    for token in command_tokens(spec):
        if token.startswith("-") or "://" in token:
            continue
        candidate = Path(token) if token.startswith("/") else spec.workdir_path / token
        try:
            rel = str(candidate.resolve().relative_to(root.resolve()))
        except (OSError, ValueError):
            continue
        if rel in untracked:
            named.add(rel)
            out.append(
                Finding(BLOCKER, "code", "command", token,
                        f"{rel} is untracked: it is neither in commit "
                        f"{str(git.get('commit') or '?')[:12]} nor in git.diff",
                        f"commit it (`git add {rel} && git commit`) and run again")
            )  # fmt: skip
    workdir_rel = _rel(spec.workdir_path, root)
    others = [
        n for n in untracked
        if n.endswith(".py") and n not in named
        and (workdir_rel is None or workdir_rel == "." or n.startswith(workdir_rel + "/"))
    ]  # fmt: skip
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        out.append(
            Finding(WARNING, "code", "git", shown,
                    "untracked Python files beside the job: if it imports them, a clone lacks them",
                    "commit them, or add them to .gitignore if the job does not use them")
        )  # fmt: skip
    return out


def _rel(path: Path, root: Path) -> str | None:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except (OSError, ValueError):
        return None


def build_findings(prov: dict[str, Any]) -> list[Finding]:
    torch = prov.get("torch") if isinstance(prov.get("torch"), dict) else None
    if not torch or torch.get("absent"):
        return []
    version = str(torch.get("version") or "")
    if "+cu" in version:
        return [
            Finding(NOTE, "pin", "provenance.torch.version", version,
                    f"torch built for CUDA {torch.get('cuda') or version.split('+cu')[1]}: the "
                    "next machine's driver must support that CUDA version",
                    "install the same wheel there (`acceptrun howto RUN` prints the command), "
                    "or check [expect] driver")
        ]  # fmt: skip
    return []
