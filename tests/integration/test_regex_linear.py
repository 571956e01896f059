"""Every regular expression acceptrun compiles runs in time linear in its input's length.

The patterns are collected, not listed: every module under src/acceptrun is imported and
each module-level ``re.Pattern`` attribute taken, plus the patterns of
``spec.fields.FORMATS`` and ``spec.conditions``. Each runs (``search``, then ``sub``) on
megabyte inputs built from its own literal characters and on generic ones (a's, digits,
spaces, ``=``, ``://``, backslashes), in a child process with a 60 s timeout: a quadratic
pattern takes hours on a megabyte, a linear one well under a second, so the timeout is a
hang guard, not a speed target. ``_util/redact.py`` is covered here too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from tests.campaign import tally

pytestmark = pytest.mark.slow

COLLECT = textwrap.dedent(
    """
    import importlib, json, pkgutil, re, sys
    import acceptrun
    found = {}
    for m in pkgutil.walk_packages(acceptrun.__path__, "acceptrun."):
        if m.name.endswith("__main__") or "._probe" in m.name:
            continue
        try:
            mod = importlib.import_module(m.name)
        except Exception:  # an optional extra (torch, mlflow) not installed
            continue
        for name, value in vars(mod).items():
            if isinstance(value, re.Pattern):
                found[f"{m.name}.{name}"] = (value.pattern, value.flags)
    from acceptrun.spec import conditions, fields
    for name, value in getattr(fields, "FORMATS", {}).items():
        pat = getattr(value, "pattern", value)
        pat = getattr(pat, "pattern", pat)
        if isinstance(pat, str):
            found[f"spec.fields.FORMATS[{name}]"] = (pat, 0)
    for name, value in vars(conditions).items():
        if isinstance(value, re.Pattern):
            found[f"spec.conditions.{name}"] = (value.pattern, value.flags)
    if isinstance(found.get("x"), tuple):
        pass
    json.dump({k: [p if isinstance(p, str) else p.decode("latin-1"), f]
               for k, (p, f) in found.items()}, sys.stdout)
    """
)

RUN = textwrap.dedent(
    """
    import re, sys, json
    pattern, flags, texts = json.loads(sys.stdin.read())
    rx = re.compile(pattern, flags)
    for i, text in enumerate(texts):
        print(i, flush=True)  # which input a hang was on
        rx.search(text)
        rx.sub("", text)
    """
)

MB = 1 << 20
GENERIC = ["a", "0", " ", "=", "://", "\\\\", "a=", "\\t", "-"]


def _collect() -> dict[str, tuple[str, int]]:
    out = subprocess.run(
        [sys.executable, "-c", COLLECT], capture_output=True, text=True, timeout=300, check=True
    )
    return {k: (p, f) for k, (p, f) in json.loads(out.stdout).items()}


def _inputs(pattern: str) -> list[str]:
    """Megabyte inputs from the pattern's own literal characters, and generic ones."""
    literal = sorted({c for c in pattern if c.isprintable() and c not in "()[]{}?*+|^$\\."})
    units = [*GENERIC, "".join(literal)[:16] or "a", *literal[:6]]
    return [(u * (MB // len(u) + 1))[:MB] for u in dict.fromkeys(units)]


PATTERNS = _collect()


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_is_linear_on_megabyte_inputs(name: str) -> None:
    if name.startswith("acceptrun._util.redact."):
        pytest.skip("the redactor's own test covers _util/redact.py's patterns")
    pattern, flags = PATTERNS[name]
    inputs = _inputs(pattern)
    slow = None
    try:  # one child per pattern: 60 s for all its inputs (each takes milliseconds)
        subprocess.run(
            [sys.executable, "-c", RUN], input=json.dumps([pattern, flags, inputs]),
            text=True, capture_output=True, timeout=60, check=True,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        last = int(out.split()[-1]) if out.split() else 0
        slow = repr(inputs[last][:12])
    tally("regexes on megabyte inputs", tried=len(inputs), tracebacks=int(slow is not None))
    assert slow is None, f"{name} ({pattern!r}) ran past 60 s on 1 MB of {slow}"
