"""Every way out of acceptrun is registered in acceptrun._util.egress, and nothing stale is.

The source of every module under src/acceptrun is walked (its AST, not its text) for the
calls that send data out of the process: a file opened for writing or appending
(``open``, ``os.open``, ``Path.open``, ``os.fdopen``), ``write_text``/``write_bytes``,
``os.write``, a durable writer called with ``raw=True``, a socket's ``send``/``sendall``/
``sendto`` or an HTTP handler's ``wfile.write``, ``urlopen`` and ``http.client``
connections, ``smtplib``, a child process given ``input=``, ``env=`` or ``stdin=``,
``os.exec*e``, a tar or zip archive opened for writing, ``print(..., file=...)``,
``sys.stdout``/``sys.stderr`` writes and ``shutil`` copies. Each must sit in a function
that :data:`acceptrun._util.egress.SINKS` registers, with how it is redacted or why it is
exempt. A sink added tomorrow fails here until someone decides which.
"""

from __future__ import annotations

import ast
import email.policy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.campaign import tally

import acceptrun
from acceptrun._util import egress
from acceptrun._util.redact import REDACTED, forget_learned, learn
from secret_shapes import SHAPES

SRC = Path(acceptrun.__file__).parent
_MODE = re.compile(r"[rwaxbt+]{1,4}([:|]\w*)?")  # "wb", "a+", tarfile's "w:gz"
_WRITING = set("wax+")
_SUBPROCESS = {"run", "Popen", "call", "check_call", "check_output"}
_SHUTIL = {"copy", "copy2", "copyfile", "copytree", "copyfileobj", "move"}
_STD = {f"sys.{s}.{b}write" for s in ("stdout", "stderr") for b in ("", "buffer.")}
_RAW_WRITERS = {"write_atomic", "write_json_atomic", "jsonl_line"}
_OS_OPEN_WRITE = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND")


@dataclass(frozen=True)
class Call:
    where: str  # "acceptrun.notify.targets:WebhookTarget.send"
    kind: str
    line: int
    what: str  # the callee as written: "urllib.request.urlopen"

    def __str__(self) -> str:
        module = self.where.split(":")[0].replace(".", "/")
        return f"{self.what}() in {self.where} (src/{module}.py:{self.line}, a {self.kind} sink)"


def _dotted(node: ast.expr) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    parts.append(node.id if isinstance(node, ast.Name) else "?")
    return ".".join(reversed(parts))


def _mode(call: ast.Call, first: int) -> str | None:
    """The call's file mode: its ``mode=``, or the first positional constant shaped like
    one from argument ``first`` on; "?" when computed; None when it gives none (reading)."""
    for kw in call.keywords:
        if kw.arg == "mode":
            value = kw.value
            return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else "?"  # fmt: skip
    for arg in call.args[first : first + 2]:
        if (
            isinstance(arg, ast.Constant)
            and isinstance(arg.value, str)
            and _MODE.fullmatch(arg.value)
        ):
            return arg.value
    return None


def _writes(mode: str | None) -> bool:
    return mode is not None and (mode == "?" or bool(set(mode) & _WRITING))


def _keywords(call: ast.Call) -> set[str]:
    return {kw.arg for kw in call.keywords if kw.arg}


def sink_kind(call: ast.Call) -> str | None:
    """What kind of way out ``call`` is, or None for a call that sends nothing out."""
    name = _dotted(call.func)
    last = name.rsplit(".", 1)[-1]
    attr = isinstance(call.func, ast.Attribute)
    if name in ("open", "io.open", "os.fdopen"):
        return "file" if _writes(_mode(call, 1)) else None
    if name == "os.open":
        flags = ast.dump(call.args[1]) if len(call.args) > 1 else ""
        return "file" if any(f in flags for f in _OS_OPEN_WRITE) else None
    if name == "tarfile.open":
        return "archive" if _writes(_mode(call, 1)) else None
    if name == "zipfile.ZipFile":
        return "archive" if _writes(_mode(call, 1)) else None
    if attr and last == "open" and name != "webbrowser.open":
        return "file" if _writes(_mode(call, 0)) else None
    if last in ("write_text", "write_bytes") or name == "os.write":
        return "file"
    if last in _RAW_WRITERS and any(
        kw.arg == "raw" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False)
        for kw in call.keywords
    ):
        return "file"
    if name in _STD or (name == "print" and "file" in _keywords(call)):
        return "terminal"
    if attr and (last in ("send", "sendall", "sendto") or name.endswith("wfile.write")):
        return "socket"
    if last in ("urlopen", "HTTPConnection", "HTTPSConnection"):
        return "http"
    if name.startswith("smtplib.") or last in ("send_message", "sendmail"):
        return "message"
    if name.startswith("subprocess.") and last in _SUBPROCESS:
        return "process" if _keywords(call) & {"input", "env", "stdin"} else None
    if name.startswith("os.exec") and name.endswith("e"):
        return "process"
    if name.startswith("shutil.") and last in _SHUTIL:
        return "file"
    return None


class _Finder(ast.NodeVisitor):
    def __init__(self, module: str) -> None:
        self.module = module
        self.scope: list[str] = []
        self.calls: list[Call] = []
        self.functions: set[str] = {f"{module}:<module>"}

    def _enter(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.functions.add(f"{self.module}:{'.'.join(self.scope)}")
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _enter

    def visit_Call(self, node: ast.Call) -> None:
        kind = sink_kind(node)
        if kind is not None:
            where = f"{self.module}:{'.'.join(self.scope) or '<module>'}"
            self.calls.append(Call(where, kind, node.lineno, _dotted(node.func)))
        self.generic_visit(node)


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def _scan() -> tuple[list[Call], set[str]]:
    calls: list[Call] = []
    functions: set[str] = set()
    for module, path in _modules():
        finder = _Finder(module)
        finder.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        calls += finder.calls
        functions |= finder.functions
    return calls, functions


CALLS, FUNCTIONS = _scan()


def test_every_sink_call_is_in_a_registered_function() -> None:
    unregistered = [c for c in CALLS if egress.sink(c.where) is None]
    tally("egress sinks registered", tried=len(CALLS), secrets=len(unregistered))
    assert len(CALLS) > 50, "the walk found almost no sinks: the finder is broken"
    assert not unregistered, "\n".join(
        f"{c}: register it in acceptrun._util.egress (SINKS) with how it is redacted "
        f"(redacted_by=) or why it is exempt (exempt=)"
        for c in unregistered
    )


def test_no_registration_is_stale() -> None:
    """Each registered function exists and still holds a sink call."""
    sending = {c.where for c in CALLS}
    stale = [s.where for s in egress.SINKS if s.where not in FUNCTIONS or s.where not in sending]
    assert not stale, f"registered in acceptrun._util.egress but sending nothing: {stale}"
    wheres = [s.where for s in egress.SINKS]
    assert len(wheres) == len(set(wheres)), "a function registered twice"


def test_every_registration_says_how_or_why() -> None:
    for s in egress.SINKS:
        assert (s.redacted_by or s.exempt).strip(), s.where
        assert s.kind in egress.KINDS, s.where
    with pytest.raises(ValueError, match="redacted_by or exempt"):
        egress.Sink("acceptrun.x:f", "file")


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        pytest.param("open(p, 'a')", "file", id="open-append"),
        pytest.param("open(p)", None, id="open-read"),
        pytest.param("p.open('wb')", "file", id="path-open"),
        pytest.param("p.open(mode=m)", "file", id="path-open-computed"),
        pytest.param("os.open(p, os.O_WRONLY | os.O_APPEND)", "file", id="os-open"),
        pytest.param("p.write_text(t)", "file", id="write-text"),
        pytest.param("write_atomic(p, t, raw=True)", "file", id="raw-writer"),
        pytest.param("write_atomic(p, t)", None, id="redacting-writer"),
        pytest.param("sock.sendall(b)", "socket", id="sendall"),
        pytest.param("self.wfile.write(b)", "socket", id="http-handler"),
        pytest.param("urllib.request.urlopen(r)", "http", id="urlopen"),
        pytest.param("smtplib.SMTP(h, p)", "message", id="smtp"),
        pytest.param("subprocess.run(a, input=b)", "process", id="child-stdin"),
        pytest.param("subprocess.run(a, check=True)", None, id="child-plain"),
        pytest.param("tarfile.open(p, 'w:gz')", "archive", id="tar"),
        pytest.param("print(x, file=f)", "terminal", id="print-file"),
        pytest.param("sys.stderr.write(t)", "terminal", id="stderr"),
        pytest.param("shutil.copy2(a, b)", "file", id="copy"),
    ],
)
def test_the_finder_knows_each_kind_of_sink(source: str, kind: str | None) -> None:
    call = ast.parse(source, mode="eval").body
    assert isinstance(call, ast.Call)
    assert sink_kind(call) == kind


# ---- the helpers redact before they encode ------------------------------------------------

LEARNED = "s3cr3t-learned-value-9f2c"


@pytest.fixture
def learned() -> Iterator[str]:
    learn([LEARNED])
    yield LEARNED
    forget_learned()


def test_json_body_redacts_every_string_before_encoding(learned: str) -> None:
    body = egress.json_body({"text": f'said {{"token": "abc123def"}} {learned}', "n": [learned]})
    assert b"abc123def" not in body and learned.encode() not in body
    assert body.count(REDACTED.encode()) == 3


def test_email_message_redacts_subject_and_body_before_mime(learned: str) -> None:
    long = "x" * 2000  # a line this long makes MIME choose a transfer encoding
    mail = egress.email_message(
        sender="a@example.com", to=["b@example.com"], subject=f"run failed: {learned}",
        body=f"{long}\npassword={learned} ünïcode",
    )  # fmt: skip
    raw = mail.as_bytes(policy=email.policy.SMTP)
    assert learned.encode() not in raw
    assert learned not in str(mail["Subject"]) and REDACTED in str(mail["Subject"])
    body = mail.get_content()
    assert learned not in body and "password=<redacted>" in body


def test_command_env_hands_over_no_secret(learned: str) -> None:
    base = {
        "PATH": "/usr/bin", "HF_TOKEN": "hf_abcdefghijklmnop", "MY_VAR": f"x {learned}",
        "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/1000/bus",
    }  # fmt: skip
    env = egress.command_env(base, {"ACCEPTRUN_NOTIFY_TEXT": f"failed: password={learned}"})
    assert env["PATH"] == "/usr/bin"
    assert "HF_TOKEN" not in env and "MY_VAR" not in env
    assert env["DBUS_SESSION_BUS_ADDRESS"] == base["DBUS_SESSION_BUS_ADDRESS"]
    assert env["ACCEPTRUN_NOTIFY_TEXT"] == "failed: password=<redacted>"


def test_kept_whole_patterns_are_relative_globs() -> None:
    for kept in egress.KEPT_WHOLE:
        assert not kept.pattern.startswith("/") and ".." not in kept.pattern, kept
        assert kept.reason, kept


def test_redact_lines_hides_a_key_block_whose_lines_come_one_at_a_time() -> None:
    blocks = [s for s in SHAPES if "BEGIN" in s.text]
    assert blocks
    for shape in blocks:
        lines = [f"{line}\n" for line in f"before\n{shape.text}\nafter".split("\n")]
        out = "".join(egress.redact_lines(lines))
        assert shape.needle not in out, shape.family
        assert out.startswith("before\n") and out.endswith("after\n") and REDACTED in out
        # One line at a time, the body has no shape: what a line-wise redactor let through.
        assert shape.needle in "".join(egress.redact_text(line) for line in lines)


def test_redact_lines_bounds_what_it_holds() -> None:
    begin = "-----BEGIN PRIVATE KEY-----\n"
    body = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODkw\n"
    shown = egress.redact_text(begin) + REDACTED + "\n"  # its BEGIN line, then <redacted>
    # Past BLOCK_MAX with no END: nothing more is held, and the rest of the body is left out.
    long = [begin, *[body] * (egress.BLOCK_MAX // len(body) + 5)]
    assert "".join(egress.redact_lines([*long, "after it\n"])) == shown + "after it\n"
    # A block cut short (no END line) ends at the first line that is not a body line.
    assert "".join(egress.redact_lines([begin, body, "after it\n"])) == shown + "after it\n"
    assert list(egress.redact_lines([begin, body])) == [shown]


def test_the_reliability_doc_shows_the_registry_as_it_is() -> None:
    import importlib.util

    path = Path(__file__).parents[2] / "tools" / "egress_doc.py"
    spec = importlib.util.spec_from_file_location("egress_doc", path)
    assert spec is not None and spec.loader is not None
    egress_doc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(egress_doc)
    doc = egress_doc.DOC.read_text(encoding="utf-8")
    assert egress_doc.rewritten(doc) == doc, "regenerate: python tools/egress_doc.py"
    for s in egress.SINKS:
        assert f"`{s.where.removeprefix('acceptrun.')}`" in doc
