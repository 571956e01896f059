"""The enums of record/status.py cover every value the code writes (read off the source)."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import acceptrun
from acceptrun.queue import db as queue_db
from acceptrun.record.status import (
    JOB_ACTIVE,
    JOB_ENDED,
    RUN_CLOSED,
    RUN_LIVE,
    RUN_OWNED,
    RUN_SUPERVISED,
    AttemptOutcome,
    CheckStatus,
    FailureClass,
    JobState,
    RunStatus,
)
from acceptrun.run import lifecycle
from acceptrun.supervisor import classify

SRC = Path(acceptrun.__file__).parent


def _modules(
    under: str = "", *, mentioning: tuple[str, ...] = ()
) -> Iterator[tuple[Path, ast.Module]]:
    """Parsed modules under ``SRC/under``; with ``mentioning``, only those whose text has one."""
    for path in sorted((SRC / under).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if not mentioning or any(m in text for m in mentioning):
            yield path, ast.parse(text)


def _name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _constants_assigned(func: ast.AST, var: str) -> set[str]:
    """String constants assigned to ``var`` anywhere in ``func``."""
    found = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == var and _str(node.value):
                    found.add(str(_str(node.value)))
    return found


def written_run_statuses() -> dict[str, str]:
    """Every run.json status a module writes: value -> where."""
    writers = {"update_state", "close_run", "close_standalone", "_finalize", "create_run"}
    found: dict[str, str] = {}
    for path, tree in _modules(mentioning=tuple(f"{w}(" for w in writers)):
        funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
        for func in funcs:  # a top-level function or class: where status=NAME is assigned
            for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
                if _name(call) not in writers:
                    continue
                where = f"{path.relative_to(SRC)}:{call.lineno}"
                for kw in call.keywords:
                    if kw.arg == "status":
                        if (value := _str(kw.value)) is not None:
                            found[value] = where
                        elif isinstance(kw.value, ast.Name):  # status=status: its assignments
                            found |= dict.fromkeys(_constants_assigned(func, kw.value.id), where)
                for node in ast.walk(call):  # create_run(state={"status": ...})
                    if isinstance(node, ast.Dict):
                        for k, v in zip(node.keys, node.values, strict=True):
                            if _str(k) == "status" and (value := _str(v)) is not None:
                                found[value] = where
    return found


def test_every_run_status_written_is_a_run_status() -> None:
    written = written_run_statuses()
    # The scan must see the writers it is meant to see, or it proves nothing.
    assert {"preflight", "running", "closing", "finished", "stopped", "failed_preflight"} <= set(
        written
    )
    unknown = {v: where for v, where in written.items() if v not in set(RunStatus)}
    assert not unknown, f"statuses written but not in RunStatus: {unknown}"


def test_failure_classes_are_the_classifier_s_results() -> None:
    tree = ast.parse((SRC / "supervisor" / "classify.py").read_text(encoding="utf-8"))
    named = {
        value
        for call in ast.walk(tree)
        if isinstance(call, ast.Call) and _name(call) in ("_result", "Classification")
        for value in [_str(call.args[0]) if call.args else None]
        if value is not None
    }
    assert {"success", "cuda_oom", "user_error", "stopped"} <= named
    assert named <= set(FailureClass)
    assert tuple(classify.CLASSES) == tuple(FailureClass)
    assert set(classify.RETRY_LIMITS) == set(FailureClass)


def test_attempt_outcomes_written_by_the_supervisor_are_attempt_outcomes() -> None:
    found: set[str] = set()
    for _path, tree in _modules("supervisor", mentioning=("outcome",)):
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    first = target.elts[0] if isinstance(target, ast.Tuple) else target
                    name = (
                        first.attr if isinstance(first, ast.Attribute) else getattr(first, "id", "")
                    )
                    if name != "outcome" or node.value is None:
                        continue
                    value = node.value
                    if isinstance(value, ast.Tuple) and isinstance(target, ast.Tuple):
                        value = value.elts[0]
                    if (text := _str(value)) is not None:
                        found.add(text)
            elif isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values, strict=True):
                    if _str(k) == "outcome" and (text := _str(v)) is not None:
                        found.add(text)
    assert {"success", "failed", "signaled", "wall_time", "interrupted"} <= found
    assert found <= set(AttemptOutcome), found - set(AttemptOutcome)


def test_queue_states_in_the_sql_and_the_worker_are_job_states() -> None:
    sql = (SRC / "queue" / "db.py").read_text(encoding="utf-8")
    in_sql = set(re.findall(r"state\s*=\s*'(\w+)'", sql))
    for group in re.findall(r"state IN \(([^)]*)\)", sql):
        in_sql |= set(re.findall(r"'(\w+)'", group))
    assert {"queued", "running", "preempting", "cancelled"} <= in_sql
    settled = set()
    for _path, tree in _modules("queue"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node) in ("settle", "jobs"):
                settled |= {s for a in node.args if (s := _str(a)) is not None}
            # The worker's settle decisions: Worker._outcome returns ("done", "exited 0")
            if isinstance(node, ast.FunctionDef) and node.name == "_outcome":
                for ret in ast.walk(node):
                    if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Tuple):
                        settled |= {s for s in [_str(ret.value.elts[0])] if s is not None}
    assert {"done", "failed", "queued", "cancelled"} <= settled
    assert (in_sql | settled) <= set(JobState), (in_sql | settled) - set(JobState)
    assert tuple(queue_db.STATES) == tuple(JobState)
    assert set(queue_db.ACTIVE) == set(JOB_ACTIVE) and set(queue_db.ENDED) == set(JOB_ENDED)


def test_the_sets_keep_the_meanings_the_modules_had() -> None:
    assert {"preflight", "running"} == RUN_SUPERVISED  # lifecycle: a supervisor may work on it
    assert {"preflight", "running", "closing"} == RUN_OWNED  # the queue leaves it alone
    assert {"created", "preflight", "running", "closing"} == RUN_LIVE  # top, board, cost
    assert {"finished", "failed_preflight", "stopped"} == RUN_CLOSED  # a verdict was written
    assert lifecycle.ENDED == RUN_CLOSED and lifecycle.ACTIVE == RUN_SUPERVISED
    assert set(CheckStatus) == {"pass", "fail", "not_recorded"}
    assert JOB_ACTIVE.isdisjoint(JOB_ENDED)


@pytest.mark.parametrize("member", [*RunStatus, *CheckStatus, *JobState], ids=str)
def test_a_member_is_its_string_in_json(member: str) -> None:
    assert json.dumps({"status": member}) == json.dumps({"status": str(member.value)})  # type: ignore[attr-defined]
    assert member == member.value  # type: ignore[attr-defined]
