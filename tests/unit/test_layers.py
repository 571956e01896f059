"""The layers of .importlinter hold for every import, those inside a function too.

lint-imports (`make check`) checks the same contract on the import graph; this test reads
every module's import statements itself, module level and inside functions alike, so that
a failure names the file, the line and both layers. Parsing the whole tree with ``ast``
takes over a second, so each file is scanned line by line (triple-quoted strings skipped)
and only the import statements found are parsed.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = "acceptrun"
_STATEMENT = re.compile(r"[ \t]*(?:import|from)[ \t]")
_QUOTES = re.compile(r"\"\"\"|'''|#")


def read_layers(text: str) -> list[tuple[list[str], bool]]:
    """The rows of the layers contract, highest first: (packages, independent)."""
    rows: list[tuple[list[str], bool]] = []
    inside = False
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if line.strip().startswith("layers"):
            inside = True
            continue
        if inside:
            if not line or not line[0].isspace():
                if rows:
                    break
                continue
            independent = "|" in line
            names = [n.strip() for n in re.split(r"[|:]", line) if n.strip()]
            rows.append((names, independent))
    return rows


def import_statements(text: str) -> list[tuple[int, str]]:
    """(line, statement) for each import statement outside triple-quoted strings."""
    found: list[tuple[int, str]] = []
    lines = text.splitlines()
    quote: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        start = i
        if quote is None and _STATEMENT.match(line):
            stmt = line
            while (stmt.count("(") > stmt.count(")") or stmt.endswith("\\")) and i + 1 < len(lines):
                i += 1
                stmt += "\n" + lines[i]
            found.append((start + 1, stmt))
            i += 1
            continue
        for m in _QUOTES.finditer(line):
            token = m.group()
            if quote is None:
                if token == "#":
                    break
                quote = token
            elif token == quote:
                quote = None
        i += 1
    return found


def imported_modules(module: str, is_package: bool, stmt: str) -> list[str]:
    """The modules an import statement of ``module`` names, absolute."""
    try:
        tree = ast.parse(textwrap.dedent(stmt).replace("\\\n", " "))
    except SyntaxError:
        return []  # prose that starts with "from" or "import"
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                parts = parts if is_package else parts[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names += [f"{base}.{a.name}" for a in node.names] if base == PACKAGE else [base]
    return names


def upward_imports(src: Path, layers: list[tuple[list[str], bool]]) -> list[str]:
    """Every import that goes from a lower layer into a higher one, or across independent siblings."""
    row_of = {name: row for row, (names, _) in enumerate(layers) for name in names}
    problems = []
    for path in sorted((src / PACKAGE).rglob("*.py")):
        rel = path.relative_to(src).with_suffix("")
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        if len(parts) < 2 or parts[1] not in row_of:
            continue  # the package's face and top-level modules sit in no layer
        module, own = ".".join(parts), parts[1]
        for line, stmt in import_statements(path.read_text()):
            for target in imported_modules(module, is_package, stmt):
                tparts = target.split(".")
                if tparts[0] != PACKAGE or len(tparts) < 2 or tparts[1] not in row_of:
                    continue
                other = tparts[1]
                if other == own:
                    continue
                mine, theirs = row_of[own], row_of[other]
                where = f"{path.relative_to(src.parent)}:{line}"
                if theirs < mine:
                    problems.append(
                        f"{where}: {module} (layer {' : '.join(layers[mine][0])}) imports "
                        f"{target} from a higher layer ({' : '.join(layers[theirs][0])})"
                    )
                elif theirs == mine and layers[mine][1]:
                    problems.append(
                        f"{where}: {module} imports {target}, an independent sibling on its row "
                        f"({' | '.join(layers[mine][0])})"
                    )
    return problems


def test_contract_has_layers_and_no_exemption() -> None:
    text = (ROOT / ".importlinter").read_text()
    layers = read_layers(text)
    assert len(layers) > 5 and layers[0][0] == ["cli"] and layers[-1][0] == ["_util"]
    packages = {p.name for p in (SRC / PACKAGE).iterdir() if (p / "__init__.py").is_file()}
    listed = {name for names, _ in layers for name in names}
    assert packages == listed, (
        f"packages not in a layer: {packages - listed or '-'}; gone: {listed - packages or '-'}"
    )
    assert "ignore_imports" not in text


def test_no_import_crosses_a_layer_upward() -> None:
    problems = upward_imports(SRC, read_layers((ROOT / ".importlinter").read_text()))
    assert not problems, "\n".join(problems)


def test_an_upward_import_inside_a_function_is_named(tmp_path: Path) -> None:
    pkg = tmp_path / "src" / PACKAGE
    for name in ("high", "low"):
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text("")
    (pkg / "low" / "mod.py").write_text(
        '"""Docs.\n\nfrom acceptrun.high import prose\n"""\n\nimport os\n\n\n'
        "def f():\n    from acceptrun.high import (\n        thing,\n    )\n"
        "    from ..high.sub import other\n"
    )
    problems = upward_imports(tmp_path / "src", [(["high"], False), (["low"], False)])
    assert problems == [
        "src/acceptrun/low/mod.py:10: acceptrun.low.mod (layer low) imports acceptrun.high "
        "from a higher layer (high)",
        "src/acceptrun/low/mod.py:13: acceptrun.low.mod (layer low) imports acceptrun.high.sub "
        "from a higher layer (high)",
    ]
    siblings = upward_imports(tmp_path / "src", [(["high", "low"], True)])
    assert len(siblings) == 2 and "independent sibling" in siblings[0]
