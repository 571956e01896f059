"""Reading a spec file: TOML, then the declared fields, then the paths resolved.

``load_spec(path)`` is the one way to read a spec, the user's or a run record's frozen
copy: every problem is reported at once, each naming the field path, the bad value and
what is accepted ("did you mean" for unknown keys, line:column for TOML syntax errors).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acceptrun._util.confined import open_regular
from acceptrun._util.durable import MAX_JSON_DEPTH, deeper_than
from acceptrun._util.redact import learn_spec
from acceptrun.errors import SpecError, UnsafeFileError
from acceptrun.spec.fields import build

if TYPE_CHECKING:
    from acceptrun.spec.model import RunSpec

__all__ = ["MAX_TOML_BYTES", "load_spec", "loads_toml", "parse_spec"]

# A spec or a price catalog is kilobytes; past this it is not one (and tomllib would hold
# it, and every nested value, in memory). Nesting is bounded like JSON's (MAX_JSON_DEPTH).
MAX_TOML_BYTES = 16 << 20


def loads_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads`` within limits: bad content always raises ``TOMLDecodeError``.

    Over :data:`MAX_TOML_BYTES` (16 MiB), nesting deeper than ``MAX_JSON_DEPTH`` (64)
    levels of arrays and inline tables (RecursionError inside tomllib), and MemoryError
    come out as a ``TOMLDecodeError`` saying which, so every caller's one ``except``
    names the file and the fix.

    >>> loads_toml("a = " + "[" * 100 + "]" * 100)
    Traceback (most recent call last):
    tomllib.TOMLDecodeError: nested deeper than 64 levels
    """
    if len(text) > MAX_TOML_BYTES:
        raise tomllib.TOMLDecodeError(
            f"larger than the {MAX_TOML_BYTES >> 20} MiB limit ({len(text)} characters)"
        )
    try:
        raw = tomllib.loads(text)
    except RecursionError:
        raise tomllib.TOMLDecodeError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except MemoryError:
        raise tomllib.TOMLDecodeError("too large to hold in memory") from None
    if deeper_than(raw, MAX_JSON_DEPTH):
        raise tomllib.TOMLDecodeError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return raw


def load_spec(path: str | Path) -> RunSpec:
    """Read, parse and validate a spec file; raises :class:`SpecError` with every problem.

    Only a regular file is read (:func:`acceptrun._util.confined.open_regular`): a FIFO
    would block the command for ever, a device never ends. A spec the user names may be a
    symlink; a run record's frozen spec (``spec.toml`` beside its ``run.json``) is a record
    file, and is never read through one.
    """
    path = Path(path)
    frozen = path.name == "spec.toml" and (path.parent / "run.json").exists()
    try:
        with open_regular(path, root=path.parent if frozen else None) as f:
            data = f.read(MAX_TOML_BYTES + 1)  # a huge file costs no more than the limit
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise SpecError(str(path), ["file not found; create one with `acceptrun init`"]) from None
    except UnsafeFileError as exc:
        if frozen:
            why = (
                f"is {exc.what}, not a regular file: the run's frozen spec is not read; "
                "restore it from a copy of the record"
            )
        elif exc.what == "a directory":
            why = "is a directory; give the path of a .toml spec file"
        else:
            why = f"is {exc.what}, not a regular file: it is not read; give the spec file itself"
        raise SpecError(str(path), [why]) from None
    except OSError as exc:  # no permission, an I/O error
        raise SpecError(
            str(path), [f"cannot be read ({exc.strerror or exc}); check its permissions"]
        ) from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            str(path), [f"is not UTF-8 text ({exc.reason} at byte {exc.start})"]
        ) from None
    return parse_spec(text, source=str(path), base_dir=path.resolve().parent)


def parse_spec(text: str, *, source: str = "<spec>", base_dir: str | Path = ".") -> RunSpec:
    """Parse spec text; paths in it are relative to ``base_dir``."""
    # model.py re-exports this module's functions, so the model is imported when called.
    from acceptrun.spec.model import RunSpec

    try:
        raw = loads_toml(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(source, [toml_error(exc)]) from None
    learn_spec(raw)  # its secrets are hidden wherever they recur, from here on (redact.py)
    problems: list[str] = []
    spec: RunSpec | None = build(RunSpec, raw, "", problems)
    if problems or spec is None:
        raise SpecError(source, problems)
    spec.source = source
    spec.base_dir = str(Path(base_dir).resolve())
    return spec


def toml_error(exc: tomllib.TOMLDecodeError) -> str:
    """A TOML syntax error with its line and column, e.g. ``TOML syntax error at line 3, ...``."""
    message = str(exc)
    match = re.search(r"\(at line (\d+), column (\d+)\)", message)
    if match:
        where = f"line {match[1]}, column {match[2]}"
        what = message[: match.start()].strip()
        return f"TOML syntax error at {where}: {what}"
    if "end of document" in message:
        what = message.split("(")[0].strip()
        return f"TOML syntax error at the end of the file: {what}"
    return f"TOML syntax error: {message}"
