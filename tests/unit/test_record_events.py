"""The event registry: every kind the source writes is in it, readers validate against it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import acceptrun
from acceptrun.record.events import EVENT_KINDS, event_table, validate_event

SRC = Path(acceptrun.__file__).parent
DOC = SRC.parents[1] / "docs" / "architecture.md"
# Calls that append an event: RunRecord.event and the hooks that forward to it.
WRITERS = frozenset({"event", "_event", "_emit", "on_event", "_event_sink"})


def _name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"``: kinds written through a constant."""
    return {
        t.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for t in node.targets
        if isinstance(t, ast.Name)
    }


def written_events() -> Iterator[tuple[str, str, set[str] | None]]:
    """(kind, where, fields written or None when some come from ``**mapping``)."""
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if not any(f"{w}(" in text for w in WRITERS) and "event=(" not in text:
            continue
        tree = ast.parse(text)
        names = _constants(tree)
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            where = f"{path.relative_to(SRC)}:{call.lineno}"
            for kw in call.keywords:  # a stop's event=("idle_stop", {...})
                if kw.arg == "event" and isinstance(kw.value, ast.Tuple):
                    first = kw.value.elts[0]
                    if isinstance(first, ast.Constant) and isinstance(first.value, str):
                        yield first.value, where, None
            if _name(call) not in WRITERS or not call.args:
                continue
            first = call.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                kind = first.value
            elif isinstance(first, ast.Name) and first.id in names:
                kind = names[first.id]
            else:
                continue  # a forwarding hook: its callers are scanned
            fields: set[str] | None = set()
            for kw in call.keywords:
                if kw.arg is None:
                    fields = None
                elif fields is not None and kw.arg not in ("sync", "defer"):
                    fields.add(kw.arg)
            for arg in call.args[1:]:
                if isinstance(arg, ast.Dict) and fields is not None and None not in arg.keys:
                    fields |= {k.value for k in arg.keys if isinstance(k, ast.Constant)}
                elif not isinstance(arg, ast.Constant):
                    fields = None
            yield kind, where, fields


def test_every_kind_the_source_writes_is_registered() -> None:
    written = {kind: where for kind, where, _ in written_events()}
    # The scan must see the writers it is meant to, or it proves nothing.
    assert {"step", "attempt_exit", "checkpoint_commit", "idle_stop", "best_effort_failed"} <= set(
        written
    )
    missing = {k: w for k, w in written.items() if k not in EVENT_KINDS}
    assert not missing, f"event kinds written but not in record/events.py: {missing}"


def test_each_writer_writes_the_required_fields_of_its_kind() -> None:
    """Where a call names all its fields, they include the kind's required ones.

    ``attempt`` is left out: the supervisor's and the client's hooks add it.
    """
    short = []
    for kind, where, fields in written_events():
        if fields is None or kind not in EVENT_KINDS:
            continue
        lacking = EVENT_KINDS[kind].required - fields - {"attempt"}
        if lacking:
            short.append(f"{where} writes {kind} without {sorted(lacking)}")
    assert not short, "\n".join(short)


@pytest.mark.parametrize(
    ("event", "known", "problems"),
    [
        pytest.param({"t": 1.0, "kind": "step", "step": 3, "loss": 0.5}, True, (), id="step"),
        pytest.param(
            {"t": 1.0, "kind": "attempt_exit", "attempt": 1},
            True,
            ("attempt_exit event at t=1.0 lacks required field outcome",),
            id="missing-field",
        ),
        pytest.param({"t": 1.0, "kind": "from_a_newer_acceptrun", "x": 1}, False, (), id="unknown"),
        pytest.param({"t": 1.0}, False, ("event at t=1.0 has no kind",), id="no-kind"),
        pytest.param(
            {"kind": "verdict", "verdict": "accepted"},
            True,
            ("verdict event has no time t (got None)",),
            id="no-time",
        ),
        pytest.param(["step"], False, ("event is a list, not an object",), id="not-an-object"),
    ],
)
def test_validate_event(event: object, known: bool, problems: tuple[str, ...]) -> None:
    check = validate_event(event)
    assert (check.known, check.problems, check.ok) == (known, problems, not problems)


def test_every_registered_kind_names_its_meaning_and_writer() -> None:
    for name, kind in EVENT_KINDS.items():
        assert kind.name == name and kind.meaning and kind.writer
        assert not (kind.required & kind.optional)
        assert "t" not in kind.required | kind.optional


def test_the_architecture_doc_lists_the_registry() -> None:
    """docs/architecture.md carries the table the registry prints; regenerate it with
    ``python -m acceptrun.record.events`` after adding a kind."""
    assert event_table() in DOC.read_text(encoding="utf-8")
