"""Failure classes: why an attempt ended, and whether a restart can help.

:func:`classify` turns the facts the supervisor gathers about one ended attempt (exit
status or signal, its own stop cause, the tail of stderr, the attempt's events, the
cgroup's OOM-kill count, NVML Xid errors) into one of :data:`CLASSES`, with the lines
that decided it. The first rule that matches wins:

1. the supervisor stopped it for ``wall_time``, ``budget`` or ``idle``: that name, no retry
2. the supervisor stopped it on a user's request: ``stopped``, no retry
3. the supervisor ended it as ``hang`` or ``data_stall``: that name, retry
4. exit status 0: ``success``
5. a ``diverged`` event: ``diverged``, no retry (rollback is the supervisor's decision)
5b. the supervisor sent an injected time fault (``kill@time=3s``, ``term@time=3s``) and
   the attempt ended by it: ``killed`` or ``preempted``, said to be injected, retry
6. a ``stopped`` event, exit status 143 or SIGTERM that the supervisor did not send:
   ``preempted``, retry; but not a multi-node step whose first failed task exited with a
   status of its own (srun then ends the step and exits 143 itself): the stderr decides
7. an import, syntax, path or name error, an argparse usage error (exit 2), ``can't open
   file``, or exit 126/127 from a shell: ``user_error`` (no retry) when no step happened
   yet; after a step the same errors are ``failed`` (retry: a file that vanishes mid-run
   can be a flaky mount). A process that died by a signal is never a user error.
7b. a full file system (``DiskFullError``, ``[Errno 28] No space left on device``, a
   quota, or ``[Errno 27] File too large`` from a file-size limit): ``disk_full``, no
   retry (a restart would fill the same disk at the same step; free space, then
   ``acceptrun resume``)
8. a CUDA out-of-memory error: ``cuda_oom``, one retry
9. ``MemoryError`` (or torch's/numpy's host allocation failure), or SIGKILL / exit 137 /
   a "Killed" line while the kernel counted an OOM kill in our cgroup: ``host_oom``,
   one retry
9b. a multi-node step (srun) whose first failed task died by a signal, not by an exit
   status of its own: ``node_lost``, retry. srun's ``srun: error: NODE: task I: Killed``
   lines and each node's ``acceptrun-node:`` line (acceptrun.workload.slurm_step) are
   the evidence: which node failed first and how every node's processes ended
10. an Xid error from NVML or a CUDA fault (illegal address, ECC, launch failure,
    device-side assert, fallen off the bus): ``gpu_fault``, retry
11. an NCCL, gloo, rendezvous or torchrun child failure: ``distributed``, retry
12. any other signal (SIGKILL without OOM evidence, SIGSEGV, SIGBUS, SIGABRT), or exit
    status 128+N from a shell whose child signal N killed: ``killed``, retry
13. anything else: ``failed``, retry

One class is never named here: ``setup_changed``, an attempt not started because the
data or the packages preflight verified changed since (capture/reverify.py, recorded by
supervisor/restarts.py RestartPolicy.refused); no process ran, so there is nothing to
classify, and no retry.

After classifying, the supervisor compares a ``failed`` attempt with the one before it
(:func:`repeated_failure`): the same final exception, raised from the same line, in the
same step (or both before their first step) is deterministic. A restart from the same
checkpoint would fail the same way, so it becomes ``user_error``, with both attempts'
tracebacks as evidence.

Which stderr lines count (rules 7-11): the final exception of a Python traceback decides,
since lines above it are often warnings or handled errors. That is the block after the
last ``Traceback (most recent call last):`` header, plus the tracebacks chained to it
("During handling of the above exception ..."). When the last traceback is torchrun's
``ChildFailedError`` and the child's own traceback is in the tail, the child's block
decides: torchrun only wraps it. Without a traceback (a C++ abort, a non-Python
workload) or when a signal ended the process, every line of the tail counts. Info and
warning lines (``[W...]``, ``UserWarning: ...``) never count.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from acceptrun._util.redact import redact_text, secret_values
from acceptrun.record.status import RETRYABLE_CLASSES, FailureClass

__all__ = [
    "CLASSES",
    "RETRY_LIMITS",
    "AttemptFacts",
    "Classification",
    "FailedAttempt",
    "classify",
    "client_fault",
    "oom_kill_count",
    "repeated_failure",
    "retry_allowed",
    "stderr_tail",
]

CLASSES = tuple(FailureClass)
_RETRYABLE = RETRYABLE_CLASSES
# Per-class caps on top of limits.max_restarts: an OOM that recurs after one restart
# will recur on every restart (same model, same batch), so more would only burn GPU hours.
RETRY_LIMITS: dict[str, int | None] = {name: None for name in CLASSES} | {
    "cuda_oom": 1,
    "host_oom": 1,
}

_CAUSES = ("user", "notice", "wall_time", "budget", "idle", "hang", "data_stall")  # stop_cause
MAX_EVIDENCE = 5  # lines per classification: enough to decide, short enough for exit.json
MAX_LINE = 300  # characters per evidence line
_TAIL_LINES = 10  # without a traceback, how many last lines tell how a process ended

_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = re.compile(
    r"^(?:During handling of the above exception|The above exception was the direct cause)"
)
# torch.distributed prefixes each rank's lines; torchrun --tee prefixes "[default0]:".
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]: ?")
# c10/glog info and warning lines ("[W1218 20:27:21 ProcessGroupNCCL.cpp:...]", "I1130 ...")
# and Python warnings name the same words as real errors ("ProcessGroupNCCL", "ImportError").
_NOISE = re.compile(r"^\[[IWV][\d ]|^[IWV]\d{4} \d|\b\w*Warning: ")

_USER_EXC = re.compile(
    r"^(?:[\w.]+\.)?(ModuleNotFoundError|ImportError|SyntaxError|IndentationError|TabError"
    r"|FileNotFoundError|IsADirectoryError|NotADirectoryError|PermissionError|NameError)\b"
)
_ARGPARSE = re.compile(r"^\S+: error: ")  # argparse: "prog: error: ...", exit status 2
_CANT_OPEN = re.compile(r": can't open file '.*\[Errno \d+\]")  # python missing.py
_SHELL = re.compile(r"(?:command )?not found$|Permission denied$|cannot execute")
_DISK_FULL = re.compile(
    r"DiskFullError\b|\[Errno (?:28|122|27)\]|No space left on device|Disk quota exceeded"
)
_CUDA_OOM = re.compile(
    r"torch\.(?:cuda\.)?OutOfMemoryError|CUDA out of memory|CUBLAS_STATUS_ALLOC_FAILED"
    r"|CUDA_ERROR_OUT_OF_MEMORY|CUDA error\b.*\bout of memory"
)
_HOST_OOM = re.compile(
    r"\b(?:_Array)?MemoryError\b|DefaultCPUAllocator: can't allocate memory|std::bad_alloc"
)
_KILLED = re.compile(r"\bKilled\b|\bSIGKILL\b|\bSignal 9\b")
_GPU_FAULT = re.compile(
    r"an illegal memory access was encountered|an illegal instruction was encountered"
    r"|CUDA error: unspecified launch failure|cudaErrorLaunchFailure|cudaErrorIllegalAddress"
    r"|CUDA_ERROR_ILLEGAL_ADDRESS|uncorrectable ECC error|CUDA error: device-side assert"
    r"|GPU has fallen off the bus"
)
_DISTRIBUTED = re.compile(
    r"NCCL error|nccl(?:Internal|System|UnhandledCuda|Remote)Error|ProcessGroupNCCL"
    r"|Watchdog caught collective operation timeout|DistBackendError|DistNetworkError"
    r"|Rendezvous(?:Timeout|Closed|Connection)Error|ChildFailedError"
    r"|\bgloo\b.*(?:Connection (?:closed|reset) by peer|Timed out)"
)
_WRAPPER = re.compile(r"^(?:[\w.]+\.)?ChildFailedError\b")
# srun's report of a task that ended badly: "srun: error: n2: task 1: Killed",
# "srun: error: n1: task 0: Exited with exit code 1", "srun: error: n3: tasks 4-7: ...".
_SRUN_TASK = re.compile(r"^srun: error: (?P<node>[^:\s]+): tasks? (?P<tasks>[\d,-]+): (?P<how>.+)$")
_SRUN_EXIT = re.compile(r"^Exited with exit code \d+$")
_NODE_LINE = re.compile(r"^acceptrun-node: node=\S+ task=\S+ torchrun .+$")


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    """What the supervisor knows about one ended attempt."""

    returncode: int | None  # exit status when it exited normally
    signal: str | None  # "SIGKILL" etc. when a signal ended it (returncode None then)
    stop_cause: str | None  # why the supervisor ended it; None when it ended on its own
    stderr_tail: str  # the last ~64 KiB of the attempt's stderr.log
    events: Sequence[Mapping[str, Any]]  # this attempt's events from events.jsonl, in order
    oom_kills: int | None = None  # OOM kills counted in our cgroup during the attempt
    xid_errors: Sequence[str] = ()  # NVML Xid events seen during the attempt
    injected: str | None = None  # the fault the supervisor fired, e.g. "kill@time=3s"


@dataclass(frozen=True, slots=True)
class Classification:
    """The failure class of an attempt, the lines that decided it, and the retry advice.

    >>> classify(AttemptFacts(0, None, None, "", [])).name
    'success'
    """

    name: str  # one of CLASSES
    evidence: list[str]  # at most MAX_EVIDENCE lines of at most MAX_LINE characters
    retry: bool  # whether a restart can help (before RETRY_LIMITS and max_restarts)
    reason: str  # one sentence for a person


@dataclass(frozen=True, slots=True)
class _Line:
    text: str  # what the patterns see: prefix removed, stripped
    raw: str  # what the evidence shows: the line as written, stripped


def classify(facts: AttemptFacts) -> Classification:
    """Name the failure class of an ended attempt (rules in the module docstring)."""
    cause, sig, rc = facts.stop_cause, facts.signal, facts.returncode
    ended = f"killed by {sig}" if sig else f"exit status {rc}"
    if cause in ("wall_time", "budget", "idle"):
        limit = {"wall_time": "wall-time limit", "budget": "cost budget", "idle": "idle limit"}
        reason = f"stopped by the supervisor at the {limit[cause]}"
        return _result(cause, [f"stop cause: {cause}", ended], reason)
    if cause == "user":
        return _result("stopped", [f"stop cause: {cause}", ended], "stopped on request")
    if cause == "notice":  # the provider takes the machine back (supervisor/notice.py)
        reason = "stopped on the provider's preemption notice"
        return _result("preempted", [f"stop cause: {cause}", ended], reason)
    if cause not in (None, "hang", "data_stall"):
        raise ValueError(f"unknown stop cause {cause!r}; expected one of {', '.join(_CAUSES)}")
    steps = [e for e in facts.events if e.get("kind") == "step"]
    if cause in ("hang", "data_stall"):
        last = _last_step(steps)
        what = "no progress" if cause == "hang" else "waiting for data"
        reason = f"{what} for longer than the limit ({last}); the supervisor ended it"
        return _result(cause, [f"stop cause: {cause}", last, ended], reason)
    if rc == 0:
        return _result("success", ["exit status 0"], "exited 0")
    if diverged := [e for e in facts.events if e.get("kind") == "diverged"]:
        ev = diverged[-1]
        reason = (
            f"the loss diverged at step {ev.get('step')} ({ev.get('reason') or ev.get('loss')})"
        )
        return _result("diverged", [_event_line(ev), ended], reason)
    stopped = [e for e in facts.events if e.get("kind") == "stopped"]
    if (found := _injected(facts, bool(stopped))) is not None:
        return found
    if (stopped or rc == 143 or sig == "SIGTERM") and not (
        not stopped and sig is None and _srun_task_failed_first(facts.stderr_tail) is not None
    ):
        evidence = [_event_line(stopped[-1])] if stopped else []
        reason = f"{ended} on a SIGTERM the supervisor did not send (a preemption or scheduler)"
        return _result("preempted", [*evidence, ended], reason)
    return _from_stderr(facts, steps, ended)


def _from_stderr(facts: AttemptFacts, steps: list[Mapping[str, Any]], ended: str) -> Classification:
    """Rules 7-13: the attempt failed on its own; stderr, signal and counters tell how."""
    sig, rc = facts.signal, facts.returncode
    lines = [
        _Line(_RANK_PREFIX.sub("", s).strip(), s.strip()) for s in facts.stderr_tail.splitlines()
    ]
    lines = [ln for ln in lines if ln.text and not _NOISE.search(ln.text)]
    final = _final_exception(facts.stderr_tail)
    head = final[0] if final is not None else lines[-_TAIL_LINES:]
    if sig is None and (found := _user_error(head, rc)):
        line, what = found
        if not steps:
            reason = f"{what} before the first step: a restart would fail the same way"
            return _result("user_error", [line, ended], reason)
        last = _last_step(steps)
        reason = f"{what} after the first step ({last}): restarting, a mount can be flaky"
        return _result("failed", [line, last, ended], reason)

    # A Python exception that ended the process decides; otherwise every line counts.
    window = final[1] if final is not None and sig is None else lines
    if sig is None and (hits := _matching(head, _DISK_FULL)):  # the final exception decides
        reason = f"disk full, not retried (free space, then `acceptrun resume`): {hits[-1][:200]}"
        return _result("disk_full", [*hits, ended], reason)
    if hits := _matching(window, _CUDA_OOM):
        reason = "the GPU ran out of memory (CUDA OOM); one retry is allowed"
        return _result("cuda_oom", [*hits, ended], reason)
    killed = _matching(window, _KILLED) if facts.oom_kills else []
    if facts.oom_kills and (sig == "SIGKILL" or rc == 137 or killed):
        counted = f"OOM kills counted in this cgroup during the attempt: {facts.oom_kills}"
        reason = (
            f"{ended}, and the kernel counted an OOM kill in this cgroup: host out of memory;"
            " one retry is allowed"
        )
        return _result("host_oom", [*killed, ended, counted], reason)
    if hits := _matching(window, _HOST_OOM):
        reason = "the workload ran out of host memory (MemoryError); one retry is allowed"
        return _result("host_oom", [*hits, ended], reason)
    if (lost := _node_lost(lines, ended)) is not None:
        return lost
    gpu = _matching(window, _GPU_FAULT)
    if facts.xid_errors or gpu:
        reason = "the GPU reported a fault (an Xid error or a CUDA fault); check it if it recurs"
        return _result("gpu_fault", [*facts.xid_errors[-2:], *gpu, ended], reason)
    if hits := _matching(window, _DISTRIBUTED):
        reason = "a collective, a peer rank or the rendezvous failed (NCCL, gloo, torchrun)"
        return _result("distributed", [*hits, ended], reason)
    exc = [_trim(final[0][0].raw)] if final is not None and final[0] else []
    if sig is None and (first := _srun_task_failed_first(facts.stderr_tail)) is not None:
        reason = f"{first.removeprefix('srun: error: ')}, and srun ended the step on every node"
        return _result("failed", [first, *exc, ended], reason)
    # 128+N is how a shell (bash -c, a launcher script) reports a child killed by signal N.
    shell_sig = _signal_name(rc - 128) if rc is not None and rc > 128 else None
    if sig is not None or shell_sig is not None:
        what = sig or f"{shell_sig} (exit status {rc} = 128 + the signal, from a shell)"
        oom = "unknown" if facts.oom_kills is None else "none"
        note = f" (OOM kills counted in this cgroup: {oom})" if sig == "SIGKILL" else ""
        return _result("killed", [ended], f"killed by {what}, not by the supervisor{note}")
    return _result("failed", [*exc, ended], f"{ended}" + (f": {exc[0][:200]}" if exc else ""))


def _srun_task_failed_first(tail: str) -> str | None:
    """srun's line for a task that ended with an exit status of its own before any other.

    srun then ends the rest of the step (``--kill-on-bad-exit``) and itself exits 143: a
    SIGTERM nobody outside sent, so neither a preemption (rule 6) nor a kill (rule 12).
    The stderr decides instead.
    """
    for text in tail.splitlines():
        if m := _SRUN_TASK.match(_RANK_PREFIX.sub("", text).strip()):
            own = bool(_SRUN_EXIT.match(m["how"])) and not m["how"].endswith(" 0")
            return text.strip() if own else None
    return None


def _node_lost(lines: list[_Line], ended: str) -> Classification | None:
    """Rule 9b: srun says the first task to fail on some node died by a signal."""
    tasks = [(m, ln) for ln in lines if (m := _SRUN_TASK.match(ln.text))]
    if not tasks or _SRUN_EXIT.match(tasks[0][0]["how"]):
        return None  # no srun step, or the first failure was a process's own exit status
    first = tasks[0][0]
    nodes = [ln.raw for _, ln in tasks] + [ln.raw for ln in lines if _NODE_LINE.match(ln.text)]
    evidence = [_trim(line) for line in dict.fromkeys(nodes)][: MAX_EVIDENCE - 1]
    reason = (
        f"node {first['node']} lost: its task {first['tasks']} ended by "
        f"{first['how'].rstrip('.')} before any other node's failed; srun ended the step on "
        "every node, a restart resumes from the newest checkpoint every rank committed"
    )
    return _result("node_lost", [*evidence, ended], reason)


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """One failed attempt as :func:`repeated_failure` compares it."""

    attempt: int
    stderr_tail: str
    step: int  # the step it was in when it failed: the one after its last step (0: the first)
    stepped: bool  # whether it logged any step (False: it failed before its first step)


def repeated_failure(earlier: FailedAttempt, later: FailedAttempt) -> Classification | None:
    """``user_error`` when two attempts in a row ended on the same exception at the same place.

    Same place: the same innermost traceback line and the same step (or, in both,
    before the first step). None when they differ or either has no Python traceback.
    """
    first, second = _exception_site(earlier.stderr_tail), _exception_site(later.stderr_tail)
    if first is None or second is None or first != second:
        return None
    if earlier.step != later.step and (earlier.stepped or later.stepped):
        return None
    exc = first[0]
    # Neither logged a step: both failed before their first one, whatever step they
    # resumed from (a resumed attempt's ``step`` is its resume point, no step it ran).
    where = (
        "before the first step"
        if not (earlier.stepped or later.stepped)
        else f"in step {later.step}"
    )
    evidence = [
        _trim(f"attempt {a.attempt} (attempts/{a.attempt}/stderr.log): {site[0]}; at {at}")
        for a, site in ((earlier, first), (later, second))
        if (at := " > ".join(site[1]) or "no frame")
    ]
    name = exc.split(":", 1)[0]
    reason = (
        f"the same {name} at the same place {where} in attempts {earlier.attempt} and "
        f"{later.attempt}: a restart would fail the same way; fix it and run again"
    )
    return Classification("user_error", evidence, False, reason)


def _exception_site(tail: str) -> tuple[str, tuple[str, ...]] | None:
    """The final exception line of the last traceback and its frames (``file:line func``)."""
    final = _final_exception(tail)
    if final is None or not final[0]:
        return None
    raw = tail.splitlines()
    start = max(i for i, s in enumerate(raw) if s.rstrip().endswith(_TRACEBACK))
    frames = tuple(
        f"{Path(m['file']).name}:{m['line']} {m['func'].strip()}"
        for s in raw[start + 1 :]
        if (m := _FRAME.match(_RANK_PREFIX.sub("", s)))
    )
    return final[0][0].text, frames[-4:]


def client_fault(events: Sequence[Mapping[str, Any]]) -> str | None:
    """The fault the workload's client fired on itself in these events (``kill@step=40``).

    A step fault (``--inject kill@step=N``) is done by the client inside the workload: a
    ``fault_injected`` event without ``by = "supervisor"``, written before the fault.
    """
    for ev in reversed(events):
        if ev.get("kind") == "fault_injected" and ev.get("by") != "supervisor":
            action, step = ev.get("action"), ev.get("step")
            code = f"={ev['code']}" if ev.get("code") is not None else ""
            return f"{action}{code}@step={step}" if step is not None else f"{action}{code}"
    return None


def _injected(facts: AttemptFacts, stopped: bool) -> Classification | None:
    """Rule 5b: the attempt ended by a fault injected as asked (``--inject``).

    The supervisor's (time faults, a black box's step faults: ``facts.injected``) or the
    one the client fired on itself (a ``fault_injected`` event of the workload).
    """
    fault, sig, rc = facts.injected, facts.signal, facts.returncode
    by = "sent by the supervisor"
    if fault is None:
        fault = client_fault(facts.events)
        by = "done by the workload's client, as asked"
    if fault is None:
        return None
    ended = f"killed by {sig}" if sig else f"exit status {rc}"
    if fault.startswith("kill") and (sig == "SIGKILL" or rc == 137):
        name = "killed"
    elif fault.startswith("term") and (stopped or sig == "SIGTERM" or rc == 143):
        name = "preempted"
    elif fault.startswith("exit=") and rc is not None and fault.split("@")[0] == f"exit={rc}":
        name = "failed"
    else:
        return None  # it ended some other way after the fault: the usual rules decide
    verb = {"killed": "killed", "preempted": "stopped", "failed": "ended"}[name]
    reason = f"{verb} by the injected fault {fault} ({ended}), {by}"
    return _result(name, [f"injected fault: {fault}", ended], reason)


def retry_allowed(name: str, previous_same_class: int) -> bool:
    """Whether an attempt of class ``name`` may be restarted, after ``previous_same_class``
    restarts that followed the same class. ``limits.max_restarts`` still applies on top.

    >>> retry_allowed("cuda_oom", 0), retry_allowed("cuda_oom", 1), retry_allowed("failed", 9)
    (True, False, True)
    """
    if name not in CLASSES:
        raise ValueError(f"unknown failure class {name!r}; expected one of {', '.join(CLASSES)}")
    cap = RETRY_LIMITS.get(name)
    return name in _RETRYABLE and (cap is None or previous_same_class < cap)


def stderr_tail(path: str | Path, limit: int = 65536, env: Mapping[str, str] | None = None) -> str:
    """The last ``limit`` bytes of a log, decoded (bad bytes replaced); "" if unreadable.

    A cut first line is dropped: half a line could match a pattern it does not hold.
    Secrets are redacted: the values of secret-looking variables of ``env`` (the
    workload's environment; default this process's), URL credentials, ``--token X``.
    """
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return ""  # classifying must not fail because the log is missing
    if size > limit:
        data = data.partition(b"\n")[2]
    # What is quoted from the log becomes evidence in exit.json, events, the verdict and the
    # report: secrets in it (known values, URL credentials, --token X) are redacted here.
    secrets = secret_values(env) if env is not None else None
    return redact_text(data.decode("utf-8", errors="replace"), secrets)


def oom_kill_count() -> int | None:
    """OOM kills the kernel counted in this process's memory cgroup, or None if unknown.

    cgroup v2: ``oom_kill`` in ``memory.events``; v1: ``oom_kill`` in
    ``memory.oom_control`` (kernel 4.13+). Children inherit the cgroup, so the
    supervisor reads this before and after an attempt and takes the difference.
    """
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    # "0::/path" is the v2 cgroup, "4:memory:/path" the v1 memory one. v2 first: on a
    # hybrid host v2 has no memory.events and the v1 memory controller answers.
    rows = [r for r in (line.split(":", 2) for line in lines) if len(r) == 3]
    wanted = [(r[2], "cgroup2", "memory.events") for r in rows if r[:2] == ["0", ""]]
    wanted += [(r[2], "cgroup", "memory.oom_control") for r in rows if "memory" in r[1].split(",")]
    for cgpath, fstype, filename in wanted:
        for mount in mounts:
            fields, _, tail = mount.partition(" - ")
            parts, fs = fields.split(), tail.split()
            if len(parts) < 5 or len(fs) < 3 or fs[0] != fstype:
                continue
            if fstype == "cgroup" and "memory" not in fs[2].split(","):
                continue
            # A mount shows the hierarchy from its root down (a container often mounts only
            # its own cgroup). mountinfo escapes a space as \040.
            root, point = parts[3].replace("\\040", " "), parts[4].replace("\\040", " ")
            if cgpath != root and not cgpath.startswith(root.rstrip("/") + "/"):
                continue
            path = Path(point, cgpath[len(root) :].lstrip("/"), filename)
            with contextlib.suppress(OSError, ValueError):
                for line in path.read_text().splitlines():
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
    return None


def _final_exception(tail: str) -> tuple[list[_Line], list[_Line]] | None:
    """The final Python exception's lines, and those plus the exceptions chained to it.

    None when the tail holds no traceback (see the module docstring).
    """
    raw = tail.splitlines()
    headers = [i for i, s in enumerate(raw) if s.rstrip().endswith(_TRACEBACK)]
    if not headers:
        return None
    blocks: list[tuple[list[_Line], bool]] = []  # (block, chained to the next one)
    for n, start in enumerate(headers):
        end = headers[n + 1] if n + 1 < len(headers) else len(raw)
        # The header's prefix ("[rank0]: ", a logger's "ERROR ... [core.py:708] ") is on
        # every line of that traceback; without it, frame lines are the indented ones.
        prefix = raw[start][: raw[start].rindex(_TRACEBACK)]
        block, chained, in_frames = [], False, True
        for s in raw[start + 1 : end]:
            text = s[len(prefix) :] if prefix and s.startswith(prefix) else s
            in_frames = in_frames and (not text.strip() or text[:1].isspace())
            if in_frames or not text.strip() or _NOISE.search(text):
                continue
            if _CHAINED.match(text.strip()):
                chained = True  # the next traceback was raised while handling this one
                continue
            block.append(_Line(text.strip(), s.strip()))
        blocks.append((block, chained))
    i = len(blocks) - 1
    if blocks[i][0] and _WRAPPER.match(blocks[i][0][0].text) and i > 0:
        i -= 1  # torchrun's ChildFailedError: the child's traceback above it decides
    deciding, lines = blocks[i][0], list(blocks[i][0])
    while i > 0 and blocks[i - 1][1]:
        i -= 1
        lines = blocks[i][0] + lines
    return deciding, lines


def _user_error(lines: list[_Line], rc: int | None) -> tuple[str, str] | None:
    """(evidence line, what it is) when the process ended on a user error (rule 7)."""
    for ln in reversed(lines):
        if m := _USER_EXC.match(ln.text):
            return _trim(ln.raw), m.group(1)
        if rc == 2 and _ARGPARSE.match(ln.text):
            return _trim(ln.raw), "a command-line usage error"
        if _CANT_OPEN.search(ln.text):
            return _trim(ln.raw), "a script that does not exist"
    if rc in (126, 127):
        shell = [ln for ln in lines if _SHELL.search(ln.text)]
        what = "a command that is not found" if rc == 127 else "a command that cannot run"
        return (_trim(shell[-1].raw) if shell else f"exit status {rc}"), what
    return None


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def _matching(lines: list[_Line], pattern: re.Pattern[str], most: int = 3) -> list[str]:
    """The newest ``most`` lines that match, in the order they were written."""
    return [_trim(ln.raw) for ln in lines if pattern.search(ln.text)][-most:]


def _last_step(steps: list[Mapping[str, Any]]) -> str:
    if not steps:
        return "no step event in this attempt"
    ev, t = steps[-1], steps[-1].get("t")
    when = ""
    if isinstance(t, int | float):  # unix seconds, written by RunRecord.event
        when = f" at {datetime.fromtimestamp(t, tz=UTC):%Y-%m-%dT%H:%M:%SZ}"
    return f"last step event: step {ev.get('step')}{when}"


def _event_line(event: Mapping[str, Any]) -> str:
    return _trim(json.dumps(dict(event), default=str))


def _trim(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."


def _result(name: str, evidence: list[str], reason: str) -> Classification:
    kept = list(dict.fromkeys(e for e in evidence if e))[:MAX_EVIDENCE]
    return Classification(name, kept, name in _RETRYABLE, reason)
