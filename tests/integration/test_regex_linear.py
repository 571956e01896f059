"""Every regular expression acceptrun compiles runs in time linear in its input's length.

The patterns are collected, not listed: a child process imports every module under
src/acceptrun and takes each module-level ``re.Pattern`` attribute, plus the patterns of
``spec.fields.FORMATS``, so a pattern added tomorrow is tried today. Each runs on
megabyte inputs built from its own literal characters and on generic ones (a's, digits,
spaces, ``=``, ``://``, backslashes): ``search`` (a pattern that backtracks fails slowly
at every start position) and the first matches of ``finditer`` (a long failed scan between
two matches, which is what ``sub`` pays). A quadratic pattern takes hours on a megabyte, a
linear one milliseconds, so the guard (60 s without progress) is a hang guard, not a speed
target. The child reports each pattern as it finishes; on a hang the parent kills it,
names the pattern, and starts a new child for the rest.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from queue import Empty, Queue

import pytest
from tests.campaign import tally

pytestmark = pytest.mark.slow

CHILD = textwrap.dedent(
    """
    import importlib, itertools, json, pkgutil, re, sys
    import acceptrun
    MB = 1 << 20
    GENERIC = ["a", "0", " ", "=", "://", "\\\\", "a=", "\\t", "-"]
    skip = set(json.loads(sys.argv[1]))
    found = {}
    for m in pkgutil.walk_packages(acceptrun.__path__, "acceptrun."):
        if m.name.endswith("__main__") or "._probe" in m.name:
            continue
        try:
            mod = importlib.import_module(m.name)
        except ImportError:  # an optional extra (mlflow, ...) not installed
            continue
        for name, value in vars(mod).items():
            if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
                found.setdefault(f"{m.name}.{name}", value)
    from acceptrun.spec import fields
    for name, fmt in fields.FORMATS.items():
        pattern = fmt.schema.get("pattern")
        if pattern:
            found[f"acceptrun.spec.fields.FORMATS[{name}]"] = re.compile(pattern)
    print(json.dumps({"patterns": len(found)}), flush=True)
    for name, rx in sorted(found.items()):
        if name in skip:
            continue
        literal = sorted({c for c in rx.pattern if c.isprintable() and c not in "()[]{}?*+|^$.\\\\"})
        units = dict.fromkeys([*GENERIC, "".join(literal)[:16] or "a", *literal[:6]])
        print(json.dumps({"start": name}), flush=True)
        for unit in units:
            text = (unit * (MB // len(unit) + 1))[:MB]
            rx.search(text)
            for _ in itertools.islice(rx.finditer(text), 100):
                pass
        print(json.dumps({"done": name, "inputs": len(units)}), flush=True)
    """
)

HANG_S = 60.0  # without a line from the child: a hang guard, milliseconds are expected


def _lines(proc: subprocess.Popen[str], out: Queue[str | None]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        out.put(line)
    out.put(None)


def _run_all() -> tuple[int, dict[str, int], list[str], str]:
    """(patterns found, inputs tried by pattern, patterns that hung, a child's error)."""
    done: dict[str, int] = {}
    hung: list[str] = []
    total = 0
    while True:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps([*done, *hung])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        lines: Queue[str | None] = Queue()
        threading.Thread(target=_lines, args=(proc, lines), daemon=True).start()
        current = None
        timeout = 600.0  # the first line comes after every module is imported (torch too)
        while True:
            try:
                line = lines.get(timeout=timeout)
            except Empty:
                proc.kill()
                proc.wait()
                if current is None:
                    return total, done, hung, "the child imported nothing in 600 s"
                hung.append(current)
                break
            if line is None:
                proc.wait()
                error = proc.stderr.read() if proc.stderr and proc.returncode else ""
                return total, done, hung, error
            msg = json.loads(line)
            timeout = HANG_S
            if "patterns" in msg:
                total = msg["patterns"]
            elif "start" in msg:
                current = msg["start"]
            else:
                done[msg["done"]] = msg["inputs"]
                current = None


def test_every_pattern_is_linear_on_megabyte_inputs() -> None:
    total, done, hung, error = _run_all()
    tally(
        "regexes on megabyte inputs",
        tried=sum(done.values()) + len(hung),
        tracebacks=len(hung) + int(bool(error)),
    )
    assert not error, error
    assert not hung, f"ran past {HANG_S:.0f} s on a megabyte input: {hung}"
    # The collection found the patterns it should: a broken walk would pass vacuously.
    assert total >= 50 and len(done) == total, (total, sorted(done))
    assert "acceptrun._util.redact._URL_USERINFO" in done or any(
        n.startswith("acceptrun._util.redact.") for n in done
    )
