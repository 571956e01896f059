"""How the command uses acceptrun, and which spec keys can take effect for it.

:func:`detect_usage` reads the command as written (never runs it):

- ``"client"``: the Python script it names (``python train.py``, ``torchrun train.py``,
  ``./train.py`` with a Python ``#!`` line) or the module it runs with ``-m`` (found in the
  workdir) imports ``acceptrun`` or ``acceptrun.integrations``;
- ``"black box"``: that script or module exists and does not;
- ``"unknown"``: a shell string, a binary, ``python -c``, or a module that is not a file
  of the workdir: what it does cannot be read.

Only the named file is read, not the modules it imports: a script that reaches the client
through a helper module of its own is a black box here (its keys warn, nothing refuses to
run; importing ``acceptrun`` in the script itself settles it).

:func:`spec_findings` turns the usage into findings: a key that does nothing for this
command is a warning; a key that would make the verdict say what it cannot know is an
error (a required restore drill on a black box without watched checkpoints and resume
arguments, or without a progress source to prove the resume; a required output that
nothing declares or registers; an acceptance metric that the framework integration the
script imports computes over one attempt, workload/aggregates.py). ``acceptrun spec check`` prints them and
``acceptrun run`` refuses the errors before any record exists. For a black box whose spec
sets ``checkpoint.every_steps = 100``::

    usage = detect_usage(spec)
    [str(f) for f in spec_findings(spec, usage)]
    # ['warning: checkpoint.every_steps = 100: ...']
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.userregex import compile_user_pattern
from acceptrun.errors import SpecError
from acceptrun.spec.model import RunSpec
from acceptrun.workload.aggregates import refusal

__all__ = [
    "BLACK_BOX",
    "CLIENT",
    "UNKNOWN",
    "Finding",
    "Usage",
    "detect_usage",
    "raise_errors",
    "spec_findings",
]

CLIENT, BLACK_BOX, UNKNOWN = "client", "black box", "unknown"
_IMPORT = re.compile(
    r"^\s*(?:import\s+(?:[\w.]+(?:\s+as\s+\w+)?\s*,\s*)*acceptrun\b"
    r"|from\s+acceptrun(?:\.[\w.]+)?\s+import\b)",
    re.M,
)
# The framework integrations a script imports (acceptrun.integrations.transformers).
_INTEGRATION = re.compile(r"\bacceptrun\.integrations\.(\w+)")
_OUTPUT = re.compile(r"""\.output\(\s*(?:name\s*=\s*)?["']([^"']+)["']""")
# Interpreter options that take a value (python -W ignore train.py).
_PY_OPTS_WITH_VALUE = {"-W", "-X", "--check-hash-based-pycs"}
_TORCHRUN = {"torchrun", "torch.distributed.run", "torch.distributed.launch"}
_READ_LIMIT = 2_000_000  # bytes of a script read for the static checks


@dataclass(frozen=True, slots=True)
class Usage:
    """How the command uses acceptrun, and why that was decided."""

    kind: str  # CLIENT | BLACK_BOX | UNKNOWN
    reason: str
    script: Path | None = None
    registers: frozenset[str] = field(default_factory=frozenset)
    """Output names the script registers itself (``run.output("name", ...)``)."""
    integrations: frozenset[str] = field(default_factory=frozenset)
    """The framework integrations it imports (``transformers`` for ``acceptrun.integrations.transformers``)."""

    @property
    def client(self) -> bool:
        return self.kind == CLIENT

    def to_dict(self) -> dict[str, Any]:
        return {
            "usage": self.kind,
            "reason": self.reason,
            "script": None if self.script is None else str(self.script),
            "registers": sorted(self.registers),
            "integrations": sorted(self.integrations),
        }


@dataclass(frozen=True, slots=True)
class Finding:
    """One spec key that cannot do what it says for this command."""

    level: str  # "error" | "warning"
    key: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.level}: {self.key}: {self.message}; {self.fix}"

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "key": self.key, "message": self.message, "fix": self.fix}


# ---- reading the command ----------------------------------------------------------------------


def detect_usage(spec: RunSpec) -> Usage:
    """Whether the command's Python script uses the client API (see the module docstring)."""
    if spec.shell:
        return Usage(UNKNOWN, "the command is a shell string: its script cannot be told")
    argv = list(spec.command)
    target = _python_target(argv, spec.workdir_path)
    if target is None:
        return Usage(UNKNOWN, f"{Path(argv[0]).name} is not a Python script acceptrun can read")
    path, what = target
    if path is None:
        return Usage(UNKNOWN, what)
    try:
        with open(path, "rb") as f:
            text = f.read(_READ_LIMIT).decode("utf-8", errors="replace")
    except OSError as exc:
        return Usage(UNKNOWN, f"{what} cannot be read ({exc.strerror})", path)
    registers = frozenset(_OUTPUT.findall(text))
    if _IMPORT.search(text):
        integrations = frozenset(_INTEGRATION.findall(text))
        return Usage(CLIENT, f"{what} imports acceptrun", path, registers, integrations)
    return Usage(BLACK_BOX, f"{what} does not import acceptrun", path, registers)


def _python_target(argv: list[str], workdir: Path) -> tuple[Path | None, str] | None:
    """(file, description) of the Python code the command runs; (None, why) when unreadable.

    None when the command is not Python at all (a binary, a shell script).
    """
    prog = Path(argv[0]).name
    rest = argv[1:]
    if prog in _TORCHRUN:
        return _torchrun_script(rest, workdir)
    if not prog.startswith("python"):
        own = workdir / argv[0]
        if argv[0].endswith(".py") or _python_shebang(own):
            return (own if own.is_file() else None, f"script {argv[0]}")
        return None
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg == "-m" and i + 1 < len(rest):
            module = rest[i + 1]
            if module in _TORCHRUN:
                return _torchrun_script(rest[i + 2 :], workdir)
            return _module_file(module, workdir)
        if arg.startswith("-m") and len(arg) > 2:
            return _module_file(arg[2:], workdir)
        if arg == "-c" or arg.startswith("-c"):
            return (None, "python -c runs inline code: it cannot be read")
        if arg in _PY_OPTS_WITH_VALUE:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        path = workdir / arg
        return (path if path.is_file() else None, f"script {arg}")
    return (None, "python without a script")


def _torchrun_script(args: list[str], workdir: Path) -> tuple[Path | None, str]:
    for i, arg in enumerate(args):
        if arg in ("-m", "--module") and i + 1 < len(args):
            return _module_file(args[i + 1], workdir)
        if arg.endswith(".py") and not arg.startswith("-"):
            path = workdir / arg
            return (path if path.is_file() else None, f"script {arg}")
    return (None, "torchrun without a script acceptrun can find")


def _module_file(module: str, workdir: Path) -> tuple[Path | None, str]:
    base = workdir.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__main__.py"):
        if candidate.is_file():
            return candidate, f"module {module}"
    return None, f"module {module} is not a file of the workdir (an installed package)"


def _python_shebang(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


# ---- what each key needs ----------------------------------------------------------------------


def spec_findings(spec: RunSpec, usage: Usage) -> list[Finding]:
    """Keys that do nothing for this command (warnings) or would make the verdict lie (errors)."""
    return [
        *_checkpoint_findings(spec, usage),
        *_source_findings(spec, usage),
        *_measure_findings(spec, usage),
        *_progress_findings(spec, usage),
        *_drill_findings(spec, usage),
        *_result_findings(spec, usage),
    ]


def _checkpoint_findings(spec: RunSpec, usage: Usage) -> Iterator[Finding]:
    """Checkpoint keys that do nothing: the script neither uses the client nor is watched."""
    ck = spec.checkpoint
    what = _what(usage)
    if not usage.client and not ck.watch:
        for key, value, does in (
            ("checkpoint.dir", ck.dir, "only the client API saves there"),
            ("checkpoint.mirror", ck.mirror, "only checkpoints acceptrun saves or captures are mirrored"),
            ("checkpoint.every_steps", ck.every_steps, "only run.maybe_checkpoint(step) reads it"),
            ("checkpoint.every", ck.every, "only run.maybe_checkpoint(step) reads it"),
            ("checkpoint.keep_best", ck.keep_best, "only checkpoints with metrics acceptrun stores are ranked"),
        ):  # fmt: skip
            if value is not None:
                yield Finding("warning", key, f"{_show(value)} has no effect: {what}; {does}",
                              "list the script's own checkpoint files in checkpoint.watch "
                              "(with checkpoint.resume_args), or save through the client "
                              "API (run.restore / run.maybe_checkpoint)")  # fmt: skip


def _source_findings(spec: RunSpec, usage: Usage) -> Iterator[Finding]:
    """What the progress source of a script without the client cannot read (two sources, a loss)."""
    client = usage.client
    prog, lim = spec.progress, spec.limits
    what = _what(usage)
    if prog.pattern is not None and prog.tensorboard is not None and not client:
        # One step axis per attempt: the first source's steps would hide the other's values
        # (they were dropped without a word), so the combination is refused.
        yield Finding("error", "progress.tensorboard", f"{prog.tensorboard!r} is set "
                      "beside progress.pattern: steps are read from one source, and the "
                      "other's values would never reach the record",
                      "keep one: progress.pattern for the printed step lines, or "
                      "progress.tensorboard (with progress.tags) for the TensorBoard "
                      "scalars")  # fmt: skip
    if lim.max_loss is not None and not client:
        has_loss = (prog.pattern is not None and "loss" in _groups(prog.pattern)) or (
            prog.tensorboard is not None
        )
        if not has_loss:
            yield Finding("warning", "limits.max_loss", f"{lim.max_loss:g} has no effect: "
                          f"{what} and no progress source reads a loss",
                          'add progress.pattern with a (?P<loss>...) group, e.g. '
                          r'"iter (?P<step>\d+): loss (?P<loss>[0-9.eE+-]+)", '
                          "or log it with run.log(step, loss=...)")  # fmt: skip


def _measure_findings(spec: RunSpec, usage: Usage) -> Iterator[Finding]:
    """Acceptance bounds nothing measures: downtime without serving, throughput without progress."""
    client = usage.client
    prog, acc = spec.progress, spec.acceptance
    what = _what(usage)
    if acc.max_downtime is not None and not spec.serving.enabled:
        yield Finding("warning", "acceptance.max_downtime", f"{acc.max_downtime:g} s has "
                      "no effect: only a serving run measures downtime, and this spec "
                      "serves nothing", "remove it, or set [serving] url and its load "
                      "(docs/inference.md)")  # fmt: skip
    if acc.throughput and not client:
        unit = acc.throughput_unit
        key = unit.split("/")[0]
        if prog.pattern is None and prog.tensorboard is None:  # no progress source
            yield Finding("warning", "acceptance.throughput", f"{acc.throughput} {unit} "
                          f"cannot be measured: {what} and the spec reads no progress",
                          "set progress.pattern (or progress.tensorboard), or log steps "
                          "with run.log(step, samples=...)")  # fmt: skip
        elif (
            key != "steps"
            and prog.tensorboard is None
            and prog.pattern is not None
            and (key not in _groups(prog.pattern))
        ):
            yield Finding("warning", "acceptance.throughput", f"{unit} cannot be measured: "
                          f"progress.pattern has no (?P<{key}>...) group",
                          f"add a (?P<{key}>\\d+) group to progress.pattern, or set "
                          'acceptance.throughput_unit = "steps/s"')  # fmt: skip


def _progress_findings(spec: RunSpec, usage: Usage) -> Iterator[Finding]:
    """A [progress] section nothing reads: the client logs steps, or tensorboard is missing."""
    client = usage.client
    prog = spec.progress
    progress = prog.pattern is not None or prog.tensorboard is not None
    if client and (progress or prog.tags):
        yield Finding("warning", "progress", "has no effect: the script logs its steps "
                      "through the client API, which the supervisor reads instead",
                      "remove [progress] from the spec")  # fmt: skip
    if (
        prog.tensorboard is not None
        and not client
        and importlib.util.find_spec("tensorboard") is None
    ):
        yield Finding("warning", "progress.tensorboard", "cannot be read: the tensorboard "
                      "package is not installed", "pip install acceptrun[tensorboard]")  # fmt: skip


def _drill_findings(spec: RunSpec, usage: Usage) -> Iterator[Finding]:
    """Required drills that cannot run, or would be skipped, for this command."""
    client = usage.client
    ck, prog, acc = spec.checkpoint, spec.progress, spec.acceptance
    watched = bool(ck.watch)
    progress = prog.pattern is not None or prog.tensorboard is not None
    level_bb = "error" if usage.kind == BLACK_BOX else "warning"
    what = _what(usage)
    if "restore" in acc.drills and not client and not (watched and ck.resume_args):
        missing = (
            "checkpoint.watch and checkpoint.resume_args"
            if not watched
            else "checkpoint.resume_args"
        )
        yield Finding(level_bb, "acceptance.drills", f'"restore" is required, but {what}: '
                      "no checkpoint of it can be restored and proven",
                      f"set {missing} (the script's own checkpoint files and the "
                      'arguments that resume from them, e.g. ["--resume", "{checkpoint}"]), '
                      'or use the client API, or remove "restore"')  # fmt: skip
    elif "restore" in acc.drills and not client and not progress:
        yield Finding(level_bb, "acceptance.drills", f'"restore" is required, but {what} '
                      "and the spec reads no progress from it: the drill could not tell a "
                      "script that resumed from one that trains from scratch",
                      r'set progress.pattern (e.g. "iter (?P<step>\d+): loss '
                      r'(?P<loss>[0-9.eE+-]+)") or progress.tensorboard, or use the '
                      'client API, or remove "restore"')  # fmt: skip
    for drill in ("kill", "preempt"):
        if drill in acc.drills and not client and not watched:
            yield Finding("warning", "acceptance.drills", f'"{drill}" is required, but '
                          f"`acceptrun drill` refuses a script without checkpoints ({what})",
                          "set checkpoint.watch (and checkpoint.resume_args), or use the client API")  # fmt: skip
    if "preempt" in acc.drills and not client and watched:
        yield Finding("warning", "acceptance.drills", '"preempt" is required, but '
                      f"{what}: nothing checkpoints on SIGTERM, so `acceptrun drill` skips "
                      "the preemption as not applicable and the verdict reads it as not "
                      "recorded", 'remove "preempt" (the kill drill measures what a '
                      "preemption loses), or save on SIGTERM through the client API")  # fmt: skip


def _result_findings(spec: RunSpec, usage: Usage) -> Iterator[Finding]:
    """Required metrics and outputs the run could never record."""
    client = usage.client
    acc = spec.acceptance
    level_bb = "error" if usage.kind == BLACK_BOX else "warning"
    what = _what(usage)
    if acc.metrics and not client:
        names = ", ".join(acc.metrics)
        yield Finding("warning", "acceptance.metrics", f"{names} can never be recorded: "
                      f"{what}, and only run.metric(name, value) records a metric",
                      "use the client API for the final metrics, or remove them (the "
                      "verdict would reject every run)")  # fmt: skip
    for framework in sorted(usage.integrations):
        for name in acc.metrics:
            refused = refusal(framework, name)
            if refused is not None:
                yield Finding("error", f"acceptance.metrics.{name}", *refused)
    for name in acc.outputs:
        if name in spec.outputs or name in usage.registers:
            continue
        if client:
            continue  # the name may be built at run time (run.output(f"...")): the verdict checks
        yield Finding(level_bb, "acceptance.outputs", f"{name!r} is required, but the spec "
                      f"does not declare it in [outputs] and {what}",
                      f'declare it: [outputs] {_toml_key(name)} = "path/to/file" '
                      "(relative to the workdir), or register it in the script with "
                      f'run.output("{name}", path)')  # fmt: skip


def raise_errors(spec: RunSpec, findings: list[Finding]) -> None:
    """Raise a SpecError listing every error finding (nothing when there is none)."""
    errors = [f"{f.key}: {f.message}; {f.fix}" for f in findings if f.level == "error"]
    if errors:
        raise SpecError(spec.source, errors)


def _what(usage: Usage) -> str:
    if usage.kind == CLIENT:
        return "the script uses the client API"
    if usage.kind == BLACK_BOX:
        name = usage.script.name if usage.script is not None else "the script"
        return f"{name} does not use the client API"
    return f"acceptrun cannot tell whether the command uses the client API ({usage.reason})"


def _show(value: Any) -> str:
    return (
        repr(value)
        if isinstance(value, str)
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )


def _toml_key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'"{name}"'


def _groups(pattern: str) -> set[str]:
    """The named groups of ``progress.pattern``, as the supervisor compiles it (on RE2)."""
    return set(compile_user_pattern(pattern, where="progress.pattern").groupindex)
