"""Faults done for real, for drills and tests: kill, term, hang, nan, oom, exit and the
campaign's (run/drills/campaign/): raise, spike, bitflip, diskfull, cktrunc, ckflip, stall,
slowckpt, slow, mirrorgone, datachange, pkgchange; and the supervisor's rdzv.

A fault is written ``ACTION@step=N`` or ``ACTION@time=DURATION``, optionally followed by
``:attempt=K`` (default 1, so the resumed attempt runs clean); ``rdzv`` is written
``rdzv@attempt=K`` (it fires when the attempt starts)::

    acceptrun run --inject kill@step=40 --inject term@step=90:attempt=2 spec.toml
    ACCEPTRUN_INJECT="kill@step=40,term@step=90:attempt=2"     # what the workload sees

A step fault may also wait for the attempt's first checkpoint, ``:after=checkpoint``
(``kill@step=40:after=checkpoint``): it fires at step N or, when no checkpoint of the
attempt is committed by then, at the first step after one is. A drill's kill is written
so (run/drills/operations.py): a kill before anything was checkpointed only shows that a
run can start over, and how soon a save lands depends on the machine's load, not on the
step number.

=========  =====================================================================
kill       SIGKILL to itself: a crash with no warning and no clean-up
term       SIGTERM to itself: the client checkpoints the finished step, exits 143
           (a preemption from outside)
hang       sleep forever inside the step, holding no lock: heartbeats go on, steps stop
nan        the loss logged for the step becomes NaN: the divergence check fires
oom        lower RLIMIT_AS a little above current use and allocate until a real
           MemoryError is raised; it propagates out of the training loop
exit=N     ``os._exit(N)``: a hard exit with status N, no atexit handlers
raise      an uncaught ``RuntimeError`` out of the training loop (a bug, a bad batch)
spike      the loss logged for the step is multiplied by 1e6 (a loss spike)
bitflip    the top exponent bit of the first value of the first array or tensor given
           to ``run.restore()`` flips in memory (silent data corruption); the loss
           logged for the step is then computed by the script from the corrupted state
diskfull   SIGXFSZ ignored and RLIMIT_FSIZE lowered to 1 byte: every later write past it
           fails with ``[Errno 27] File too large``, as a full disk fails with ENOSPC
cktrunc    the attempt's newest committed checkpoint's largest file is cut to half its
           size, then SIGKILL (a torn copy found on restore)
ckflip     one byte in the middle of that file is inverted, then SIGKILL (bit rot)
stall      the loop waits for data forever (inside ``run.data_wait()``): a stalled loader
slowckpt   the attempt's next checkpoint write sleeps ``SLOW_SAVE_S`` seconds after the
           store began it (a slow checkpoint directory, simulated inside the process:
           slowing a real file system needs root)
slow=K     this process's steps N to N+K-1 each take ``STRAGGLE_S`` seconds longer
           (``slow``: K = ``STRAGGLE_STEPS``): a straggler rank
mirrorgone the run's own local mirror root (``checkpoint.mirror/<run id>``) is moved
           aside and a plain file put in its place for ``MIRROR_OUTAGE_S`` seconds,
           then put back: every upload in between fails (the mirror unreachable)
datachange one byte of the first file of ``[data] path`` is inverted, then SIGKILL (the
           data changed under the run); only in a campaign's scratch copy of the data
           (a ``SCRATCH_MARKER`` file beside it), never in anything else
pkgchange  the version in the metadata of the campaign's scratch package
           (``SCRATCH_PACKAGE``, on PYTHONPATH) is raised, then SIGKILL (a package
           upgraded between attempts); only in a folder that holds ``SCRATCH_MARKER``
rdzv       the supervisor starts the attempt's torchrun (acceptrun's own, one node)
           with a c10d rendezvous at a loopback port where a listener of its own
           accepts and closes every connection: the rendezvous fails in seconds
           (supervisor/faults.py)
=========  =====================================================================

Step faults are fired inside the workload by the client API (:func:`fire`, called when
a step ends in ``run.steps()`` or is logged with ``run.log(step, ...)``). Time faults (``kill`` and ``term`` only) are fired by the supervisor,
which sends the signal to the workload's process group ``after_s`` seconds after the
attempt starts: they work for any command. For a black box whose steps are read from its
output (``progress.pattern``/``progress.tensorboard``), the supervisor also fires ``kill``
and ``term`` step faults, once it has read that step (and, with ``:after=checkpoint``, the
attempt's first ``checkpoint_commit``). Every fault
fired is a ``fault_injected`` event; a requested fault with none (the run ended first,
or its loop never logged that step) fails the verdict (:func:`unfired`).
"""

from __future__ import annotations

import os
import re
import resource
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acceptrun._util.durable import loads_json
from acceptrun.errors import UserError

__all__ = [
    "ACTIONS",
    "SCRATCH_MARKER",
    "SCRATCH_PACKAGE",
    "SCRATCH_VERSIONS",
    "Fault",
    "due_after_checkpoint",
    "faults_for_attempt",
    "fire",
    "parse_faults",
    "time_faults",
    "unfired",
]

ACTIONS = (
    "kill", "term", "hang", "nan", "oom", "exit=N",
    "raise", "spike", "bitflip", "diskfull", "cktrunc", "ckflip", "stall", "slowckpt",
    "mirrorgone", "datachange", "pkgchange", "slow=K", "rdzv",
)  # fmt: skip
_NAMES = ("kill", "term", "hang", "nan", "oom", "exit", *ACTIONS[6:-2], "slow", "rdzv")
LAUNCH_ACTIONS = ("rdzv",)  # fired by the supervisor as it starts the attempt: @attempt=K
_BEFORE_EMIT = ("nan", "spike")  # done before the step's values are written
SPIKE_FACTOR = 1e6  # a loss spike: six orders of magnitude above the step's own loss
TIMED_ACTIONS = ("kill", "term")  # the supervisor can only send signals from outside
FORMS = (
    "ACTION@step=N or ACTION@time=DURATION (rdzv: rdzv@attempt=K), optionally followed "
    "by :attempt=K "
    "and (step faults) :after=checkpoint, "
    f"with ACTION one of {', '.join(ACTIONS)} "
    "(e.g. kill@step=40, term@time=30s:attempt=2, exit=7@step=3, "
    "kill@step=40:after=checkpoint)"
)
SLOW_SAVE_S = 2.0  # seconds the slowed checkpoint write sleeps: many of the demo's steps
STRAGGLE_S = 0.2  # seconds a straggler's step takes longer: ten times the demo's step
STRAGGLE_STEPS = 10  # steps slowed by ``slow`` without a count
MIRROR_OUTAGE_S = 1.5  # seconds the mirror root is gone: a retry or two of its backoff
# The campaign's scratch copies (run/drills/campaign/scratch.py): datachange and pkgchange
# change only what lies beside this file, which the campaign writes into each copy it makes.
SCRATCH_MARKER = ".acceptrun-campaign-scratch"
SCRATCH_PACKAGE = "acceptrun-campaign-probe"  # a metadata-only distribution, no module
SCRATCH_VERSIONS = ("1.0", "1.1")  # as installed, as the fault rewrites it
OOM_HEADROOM = 64 * 1024 * 1024  # bytes of address space above current use left to allocate
OOM_CHUNK = 8 * 1024 * 1024  # bytes per allocation while exhausting it

_ITEM_RE = re.compile(
    r"\A(?P<action>[a-z]+)(?:=(?P<code>[^@]*))?@(?P<when>[a-z]+)=(?P<value>[^:]*)"
    r"(?P<options>(?::[^:]*)*)"
)
_OPTION_RE = re.compile(r"\A(?P<key>[a-z]+)=(?P<value>.*)")


@dataclass(frozen=True)
class Fault:
    """One fault: what to do, when (a step or seconds after the attempt starts), in which attempt."""

    action: str
    """kill, term, hang, nan, oom or exit."""
    step: int | None
    """Fire when this step ends (step faults); None for time faults."""
    after_s: float | None
    """Fire this many seconds after the attempt starts (time faults); None for step faults."""
    attempt: int = 1
    """The attempt it fires in (1 = the first launch)."""
    code: int | None = None
    """Exit status for ``exit``, steps to slow for ``slow`` (below 0: the steps still to
    slow after the first); None for the other actions."""
    after_checkpoint: bool = False
    """A step fault that waits for the attempt's first committed checkpoint (``:after=checkpoint``)."""

    def __str__(self) -> str:
        """The canonical text form, which :func:`parse_faults` reads back."""
        if self.action in LAUNCH_ACTIONS:
            return f"{self.action}@attempt={self.attempt}"
        action = self.action if self.code is None else f"{self.action}={self.code}"
        when = f"step={self.step}" if self.step is not None else f"time={self.after_s:g}s"
        after = ":after=checkpoint" if self.after_checkpoint else ""
        return f"{action}@{when}{after}:attempt={self.attempt}"


def parse_faults(text_or_items: str | Sequence[str]) -> list[Fault]:
    """Parse ``"kill@step=40,term@time=30s:attempt=2"`` (or a list of such items).

    Each item may itself hold several faults separated by commas; empty items are
    skipped. Raises :class:`~acceptrun.errors.UserError` naming the bad item and the
    accepted forms.

    >>> parse_faults("exit=7@step=3")
    [Fault(action='exit', step=3, after_s=None, attempt=1, code=7, after_checkpoint=False)]
    """
    items = [text_or_items] if isinstance(text_or_items, str) else list(text_or_items)
    faults = []
    for chunk in items:
        for item in chunk.split(","):
            if item.strip():
                faults.append(_parse_item(item.strip()))
    return faults


def _parse_item(item: str) -> Fault:
    def bad(why: str) -> UserError:
        return UserError(f"fault {item!r}: {why}; expected {FORMS}")

    m = _ITEM_RE.fullmatch(item)
    if m is None:
        raise bad("not a fault")
    action, code_text = m["action"], m["code"]
    if action not in _NAMES:
        raise bad(f"unknown action {action!r}")
    code = None
    if action == "exit":
        if code_text is None or not code_text.isdigit() or int(code_text) > 255:
            raise bad("exit needs a status from 0 to 255, as in exit=7")
        code = int(code_text)
    elif action == "slow":
        if code_text is not None and (not code_text.isdigit() or int(code_text) < 1):
            raise bad("slow takes a number of steps, 1 or more, as in slow=10")
        code = STRAGGLE_STEPS if code_text is None else int(code_text)
    elif code_text is not None:
        raise bad(f"only exit takes a value, and slow a step count ({action}={code_text} given)")
    step = after_s = None
    if action in LAUNCH_ACTIONS:
        value = m["value"]
        if m["when"] != "attempt" or not value.isdigit() or int(value) < 1 or m["options"]:
            raise bad(f"{action} fires as an attempt starts: write {action}@attempt=K (K >= 1)")
        return Fault(action, None, None, int(value))
    if m["when"] == "step":
        if not m["value"].isdigit():
            raise bad(f"step={m['value']} is not a step number (0 or more)")
        step = int(m["value"])
    elif m["when"] == "time":
        after_s = _parse_seconds(m["value"])
        if after_s is None:
            raise bad(f'time={m["value"]} is not a duration such as "30s", "2m" or 1.5')
        if action not in TIMED_ACTIONS:
            raise bad(
                f"{action} cannot be timed: the supervisor fires @time faults from outside "
                "and can only send kill or term; use @step=N for the others"
            )
    else:
        raise bad(f"{m['when']}= is not a trigger; use step= or time=")
    attempt, after_checkpoint = 1, False
    for option in m["options"].split(":")[1:]:
        o = _OPTION_RE.fullmatch(option)
        if o is None or o["key"] not in ("attempt", "after"):
            name = f"{option!r}" if o is None else f"{o['key']}="
            raise bad(f"{name} is not an option; the options are :attempt=K, :after=checkpoint")
        if o["key"] == "attempt":
            if not o["value"].isdigit() or int(o["value"]) < 1:
                raise bad(f"attempt={o['value']} is not an attempt number (1 or more)")
            attempt = int(o["value"])
        elif o["value"] != "checkpoint":
            raise bad(f"after={o['value']} is not a condition; the only one is after=checkpoint")
        elif step is None:
            raise bad(
                "only a step fault can wait for a checkpoint (ACTION@step=N:after=checkpoint)"
            )
        else:
            after_checkpoint = True
    return Fault(action, step, after_s, attempt, code, after_checkpoint)


def _parse_seconds(text: str) -> float | None:
    """Seconds from ``"30s"``, ``"2m"``, ``"1h30m"`` or a bare number; None if malformed."""
    from acceptrun.spec.model import parse_duration

    try:
        return parse_duration(float(text) if re.fullmatch(r"\d+(\.\d+)?", text) else text)
    except Exception:  # spec's validation error type is private; any failure means malformed
        return None


def faults_for_attempt(text: str, attempt: int) -> list[Fault]:
    """The step faults the workload fires itself in ``attempt`` (time faults are the supervisor's)."""
    return [f for f in parse_faults(text) if f.attempt == attempt and f.step is not None]


def time_faults(faults: Sequence[Fault], attempt: int) -> list[Fault]:
    """The ``@time`` faults of ``attempt``, soonest first, for the supervisor to fire.

    The supervisor sends SIGKILL (``kill``) or SIGTERM (``term``) to the workload's
    process group ``after_s`` seconds after the attempt started: an outside event, not
    a stop request, so the attempt ends and is classified as any real crash or
    preemption would be.
    """
    timed = [f for f in faults if f.attempt == attempt and f.after_s is not None]
    return sorted(timed, key=lambda f: f.after_s or 0.0)


def fire(run: Any, step: int, phase: str) -> None:
    """Fire ``run``'s step faults due at ``step`` in ``phase``, each once.

    Called when a step ends: by ``run.steps()``, or by ``run.log(step, ...)`` in a loop
    of the script's own. A fault with ``after_checkpoint`` first waits for the save in
    flight (blocks the loop); with none committed in this attempt yet, it waits for a
    later step (:func:`due_after_checkpoint`).

    ``before_emit`` (the step's values are about to be written): ``nan`` replaces the
    loss. ``after_step`` (the step event is written): every other action. Each fault is
    recorded as a ``fault_injected`` event, synced to disk, before it is done, since a
    kill leaves no chance to write it afterwards.
    """
    for fault in list(run._faults):
        if (fault.action in _BEFORE_EMIT) != (phase == "before_emit"):
            continue
        if fault.after_checkpoint:
            if fault.step is None or step < fault.step or not _committed(run):
                continue
        elif fault.step != step:
            continue
        run._faults.remove(fault)  # once: a loop may log the same step twice
        if fault.action == "slow" and (fault.code or 0) < 0:
            _straggle(run, fault, step)  # a straggler's later step: recorded at the first
            continue
        fields: dict[str, Any] = {
            "action": fault.action,
            "step": fault.step,
            "attempt": run.attempt,
        }
        if step != fault.step:
            fields["seen_step"] = step  # the first step after the attempt's first checkpoint
        if fault.code is not None:
            fields["code"] = fault.code
        target = _target(run, fault)
        if target is not None:
            fields["target"] = str(target)  # the ground truth: where the fault landed
        run.record.event("fault_injected", sync=True, **fields)
        if fault.action == "slow":
            _straggle(run, fault, step)
        else:
            _do(run, fault, target)


def due_after_checkpoint(fault: Fault, step: int | None, checkpoint: int | None) -> bool:
    """Whether a step fault is due at ``step`` (the newest seen) with ``checkpoint`` committed.

    ``checkpoint`` is the step of the attempt's newest committed checkpoint (None: none
    yet); it matters only for a fault with ``after_checkpoint``.

    >>> fault = parse_faults("kill@step=36:after=checkpoint")[0]
    >>> due_after_checkpoint(fault, 40, None), due_after_checkpoint(fault, 40, 24)
    (False, True)
    """
    if fault.step is None or step is None or step < fault.step:
        return False
    return checkpoint is not None or not fault.after_checkpoint


def _committed(run: Any) -> bool:
    """Whether the attempt committed a checkpoint: its own (after the save in flight, for
    which the loop waits), or one of its watched files the supervisor captured."""
    checkpointer = run._checkpointer
    if checkpointer is not None and checkpointer.wait() is not None:
        return True
    return _captured(run)


def _captured(run: Any) -> bool:
    """Whether the record holds a ``checkpoint_commit`` of this attempt (a watched capture).

    Reads only what was appended since the last call (the offset is kept on ``run``), so a
    fault waiting for a capture costs a short read per step.
    """
    if getattr(run, "_capture_seen", False):
        return True
    offset = getattr(run, "_capture_offset", 0)
    try:
        with open(run.record.events_path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return False
    complete = data[: data.rfind(b"\n") + 1]  # an incomplete last line waits for its end
    run._capture_offset = offset + len(complete)
    for line in complete.splitlines():
        if b"checkpoint_commit" not in line:
            continue
        try:
            event = loads_json(line)
        except ValueError:
            continue
        if (
            isinstance(event, dict)
            and event.get("kind") == "checkpoint_commit"
            and event.get("attempt") == run.attempt
        ):
            run._capture_seen = True
            return True
    return False


def unfired(requested: Sequence[str], events: Sequence[Mapping[str, Any]]) -> list[str]:
    """The requested faults (run.json's ``injected``) no ``fault_injected`` event shows fired.

    Each is a sentence for the verdict: what was asked and how far the run got.

    >>> unfired(["kill@step=40"], [{"kind": "step", "attempt": 1, "step": 29}])
    ['kill@step=40 requested, the run ended at step 29 without it firing']
    """
    fired = [e for e in events if e.get("kind") == "fault_injected"]
    out = []
    for fault in parse_faults(list(requested)):
        if any(_fired_as(fault, e) for e in fired):
            continue
        shown = str(fault).removesuffix(":attempt=1")
        steps = [e for e in events if e.get("kind") == "step"]
        mine = [e for e in steps if e.get("attempt") == fault.attempt]
        started = any(
            e.get("kind") == "attempt_start" and e.get("attempt") == fault.attempt for e in events
        )
        if not started and fault.attempt > 1:
            out.append(f"{shown} requested, the run never started attempt {fault.attempt}")
        elif fault.step is not None and not mine:
            last = max((int(e["step"]) for e in steps if "step" in e), default=None)
            where = "no step" if last is None else f"step {last}"
            out.append(
                f"{shown} requested, attempt {fault.attempt} logged no step (the run ended at "
                f"{where}); log steps with run.steps() or run.log(step, ...)"
            )
        elif fault.step is not None:
            last = max(int(e["step"]) for e in mine if "step" in e)
            why = ""
            if fault.after_checkpoint and not any(
                e.get("kind") == "checkpoint_commit" and e.get("attempt") == fault.attempt
                for e in events
            ):
                why = f": attempt {fault.attempt} committed no checkpoint, which it waits for"
            out.append(f"{shown} requested, the run ended at step {last} without it firing{why}")
        else:
            out.append(f"{shown} requested, attempt {fault.attempt} ended before it was due")
    return out


def _fired_as(fault: Fault, event: Mapping[str, Any]) -> bool:
    if event.get("attempt") != fault.attempt or event.get("action") != fault.action:
        return False
    if fault.step is not None:
        return event.get("step") == fault.step
    return event.get("after_s") == fault.after_s


def _do(run: Any, fault: Fault, target: Any = None) -> None:
    if fault.action in _CAMPAIGN_ACTIONS:
        _CAMPAIGN_ACTIONS[fault.action](run, target)
    elif fault.action == "nan":
        run._pending["loss"] = float("nan")
    elif fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.action == "term":
        # The client's handler runs as soon as this returns: it marks the stop, and the
        # next step boundary checkpoints this step and exits 143.
        os.kill(os.getpid(), signal.SIGTERM)
    elif fault.action == "hang":
        while True:  # a hang holds no lock: the heartbeat thread keeps beating
            time.sleep(3600)
    elif fault.action == "oom":
        _exhaust_memory()
    elif fault.action == "exit":
        os._exit(fault.code or 0)


def _exhaust_memory() -> None:
    """Raise a real MemoryError: cap the address space just above use, then fill it.

    The cap is lifted again as the error propagates, so the traceback, the exit
    handlers and the checkpointer can still allocate while the process exits.
    """
    import psutil

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = psutil.Process().memory_info().vms + OOM_HEADROOM
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    hoard = []
    try:
        while True:
            hoard.append(bytearray(OOM_CHUNK))
    finally:
        hoard.clear()
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# ---- the campaign's actions -------------------------------------------------------------------


def _target(run: Any, fault: Fault) -> Any:
    """Where a fault lands, chosen before it is recorded: a checkpoint file, a parameter."""
    if fault.action in ("cktrunc", "ckflip"):
        return _newest_checkpoint_file(run)
    if fault.action == "bitflip":
        return _first_array(run)[0]  # the parameter's name
    if fault.action == "mirrorgone":
        return _mirror_root(run)
    if fault.action == "datachange":
        return _scratch_data_file(run)
    if fault.action == "pkgchange":
        return _scratch_metadata()
    return None


def _scratch_data_file(run: Any) -> str | None:
    """The first non-empty file of ``[data] path``, when the data is a campaign's scratch
    copy (a SCRATCH_MARKER beside it); None otherwise: the user's data is never touched."""
    path = run.spec.data.path
    if not path or "://" in path:
        return None
    root = Path(run.spec.resolve_path(path))
    if not (root.parent / SCRATCH_MARKER).is_file():
        return None
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return next((str(p) for p in files if p.stat().st_size > 0), None)


def _scratch_metadata() -> str | None:
    """The METADATA of the scratch package in a PYTHONPATH folder that holds SCRATCH_MARKER."""
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        folder = Path(entry) if entry else None
        if folder is None or not (folder / SCRATCH_MARKER).is_file():
            continue
        name = SCRATCH_PACKAGE.replace("-", "_")
        meta = folder / f"{name}-{SCRATCH_VERSIONS[0]}.dist-info" / "METADATA"
        if meta.is_file():
            return str(meta)
    return None


def _newest_checkpoint_file(run: Any) -> str | None:
    """The largest file of the attempt's newest committed checkpoint (after the save in flight)."""
    if run._checkpointer is not None:
        run._checkpointer.wait()
    newest: str | None = None
    try:
        with open(run.record.events_path, "rb") as f:
            for line in f:
                if b"checkpoint_commit" not in line:
                    continue
                event = loads_json(line)
                if event.get("kind") == "checkpoint_commit" and event.get("path"):
                    newest = str(event["path"])
    except (OSError, ValueError):
        return None
    if newest is None:
        return None
    files = [p for p in Path(newest).rglob("*") if p.is_file() and p.name != "MANIFEST.json"]
    return str(max(files, key=lambda p: p.stat().st_size)) if files else None


def _first_array(run: Any) -> tuple[str | None, Any]:
    """The name and a writable view of the first float array or tensor in ``run.restore()``."""
    for name, obj in getattr(run, "_objects", {}).items():
        values = obj.state_dict().items() if hasattr(obj, "state_dict") else [(None, obj)]
        for key, value in values:
            array = _numpy_of(value)
            if array is not None:
                return (name if key is None else f"{name}.{key}"), array
    return None, None


def _numpy_of(value: Any) -> Any:
    """A writable flat numpy view of a float array or CPU tensor's memory, else None."""
    if hasattr(value, "detach"):  # torch.Tensor: its numpy view shares the storage
        if not value.is_floating_point() or value.device.type != "cpu" or value.numel() == 0:
            return None
        value = value.detach().numpy()
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    if kind != "f" or getattr(value, "size", 0) == 0 or not value.flags.writeable:
        return None
    return value.reshape(-1)


def _raise(run: Any, target: Any) -> None:
    raise RuntimeError("injected fault: an uncaught exception in the training loop")


def _spike(run: Any, target: Any) -> None:
    loss = run._pending.get("loss")
    if isinstance(loss, int | float):
        run._pending["loss"] = float(loss) * SPIKE_FACTOR


def _bitflip(run: Any, target: Any) -> None:
    """Flip the top exponent bit of the first element (little-endian: its last byte, 0x40)."""
    _, array = _first_array(run)
    if array is not None:
        array[:1].view("uint8")[array.itemsize - 1] ^= 0x40


def _diskfull(run: Any, target: Any) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the first write past it kills us
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1, hard))


def _damage(run: Any, target: Any, truncate: bool) -> None:
    if target is not None:
        with open(target, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            if truncate:
                f.truncate(size // 2)
            elif size:
                f.seek(size // 2)
                byte = f.read(1)
                f.seek(size // 2)
                f.write(bytes([byte[0] ^ 0xFF]))
            os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


def _change_data(run: Any, target: Any) -> None:
    """Invert the first byte of the scratch data file, then die: a restart must see it."""
    if target is not None:
        with open(target, "r+b") as f:
            byte = f.read(1)
            f.seek(0)
            f.write(bytes([byte[0] ^ 0xFF]))
            os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


def _change_package(run: Any, target: Any) -> None:
    """Raise the scratch package's recorded version in place, then die (an upgrade)."""
    if target is not None:
        meta = Path(target)
        old, new = SCRATCH_VERSIONS
        text = meta.read_text(encoding="utf-8").replace(f"Version: {old}", f"Version: {new}")
        meta.write_text(text, encoding="utf-8")
    os.kill(os.getpid(), signal.SIGKILL)


def _slow_save(run: Any, target: Any) -> None:
    """The attempt's next checkpoint write sleeps once it began: a slow directory's create."""
    saver = run._checkpointer
    if saver is None:
        return
    store = saver.store
    begin = store.begin

    def slow_begin(*args: Any, **kwargs: Any) -> Any:
        store.begin = begin  # once: the save after it writes at the directory's own speed
        writer = begin(*args, **kwargs)
        time.sleep(SLOW_SAVE_S)
        return writer

    store.begin = slow_begin


def _mirror_gone(run: Any, target: Any) -> None:
    """Put a plain file where the run's mirror root was; a timer puts the root back."""
    if target is None:
        return
    root = Path(target)
    aside = root.with_name(root.name + ".away")
    existed = root.is_dir()  # none yet: no upload has run; the file blocks the first
    if existed:
        os.rename(root, aside)
    root.parent.mkdir(parents=True, exist_ok=True)
    root.write_bytes(b"")  # an upload's mkdir under it fails: not a directory

    def back() -> None:
        root.unlink()
        if existed:
            os.rename(aside, root)

    timer = threading.Timer(MIRROR_OUTAGE_S, back)
    timer.daemon = True
    timer.start()


def _mirror_root(run: Any) -> str | None:
    """The run's own mirror root when it is a local directory (after the save in flight)."""
    saver = run._checkpointer
    mirror = getattr(saver, "mirror", None)
    if mirror is None:
        return None
    saver.wait()
    url = str(mirror.url).removeprefix("file://")
    return url if "://" not in url else None


def _straggle(run: Any, fault: Fault, step: int) -> None:
    """Sleep this step out, and leave the next step's slowing in the faults (K steps in all)."""
    time.sleep(STRAGGLE_S)
    left = abs(fault.code or 0) - 1
    if left > 0:
        run._faults.append(Fault("slow", step + 1, None, fault.attempt, -left))


def _stall(run: Any, target: Any) -> None:
    with run.data_wait():
        while True:  # the loader never delivers: the heartbeat goes on in phase data_wait
            time.sleep(3600)


_CAMPAIGN_ACTIONS: dict[str, Any] = {
    "raise": _raise,
    "spike": _spike,
    "bitflip": _bitflip,
    "diskfull": _diskfull,
    "cktrunc": lambda run, target: _damage(run, target, truncate=True),
    "ckflip": lambda run, target: _damage(run, target, truncate=False),
    "stall": _stall,
    "slowckpt": _slow_save,
    "mirrorgone": _mirror_gone,
    "datachange": _change_data,
    "pkgchange": _change_package,
}
