"""Every way data leaves acceptrun, registered with how it is redacted or why it is exempt.

A record is shared and a message is sent to people, so nothing acceptrun writes, prints,
serves, sends, archives or hands to a user's command may carry a secret it read. The one
redactor is :mod:`acceptrun._util.redact`; this module is the list of the places its
output goes (:data:`SINKS`: a file, the terminal, a socket, an HTTP request, an e-mail, an
archive, a child process's argv, environment or stdin), each with the function that
redacts what passes there, or the reason nothing needs to (a lock file, a cgroup file,
checkpoint tensor bytes, the workload's own output kept whole).

``tests/unit/test_egress_registry.py`` walks the source of every module and fails for a
sink call in a function that is not registered here, and for a registration whose
function no longer exists or no longer sends anything: a new way out is either redacted
or exempt on purpose, never by accident.

Redaction comes before any encoding. ``{"password": "x"}`` is a form the redactor knows;
once escaped for HTML (``{&quot;password&quot;: ...}``), JSON-encoded inside a string
(``{\\"password\\": ...}``), MIME-encoded or URL-encoded it is not. The helpers below do it in
that order for what several senders share: a JSON body (:func:`json_body`), an e-mail
(:func:`email_message`), what a command target gets (:func:`command_env`,
:func:`json_body`), a text file rewritten through the redactor (:func:`redact_file`), and
lines read one at a time, a private key's lines held together (:func:`redact_lines`).
The board's logs page redacts, then escapes (``ui.pages.logs_page``).

>>> json_body({"text": "token=abc123def"})
b'{"text": "token=<redacted>"}'
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from acceptrun._util.durable import read_bytes_bounded, write_atomic
from acceptrun._util.keyblock import BLOCK_MAX, KeyBlocks
from acceptrun._util.redact import is_secret_name, redact_record, redact_text

__all__ = [
    "BLOCK_MAX",
    "KEPT_WHOLE",
    "SINKS",
    "KeptWhole",
    "Sink",
    "command_env",
    "email_message",
    "json_body",
    "redact_file",
    "redact_lines",
    "sink",
]

KINDS = ("file", "terminal", "socket", "http", "message", "process", "archive")


@dataclass(frozen=True)
class Sink:
    """One function that sends data out, and how what it sends is redacted."""

    where: str  # "acceptrun.notify.targets:WebhookTarget.send": module, then qualified name
    kind: str  # one of KINDS
    redacted_by: str = ""  # the function that redacts it on its way out
    exempt: str = ""  # why nothing it sends needs redacting

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"sink {self.where}: kind {self.kind!r} is not one of {KINDS}")
        if bool(self.redacted_by) == bool(self.exempt):
            raise ValueError(f"sink {self.where}: give redacted_by or exempt (one of them)")


@dataclass(frozen=True)
class KeptWhole:
    """A file acceptrun keeps as it was written, unredacted on purpose; every view of it is redacted."""

    pattern: str  # a glob relative to the workspace root (fnmatch: "*" also spans "/")
    reason: str


# Files of a workspace that hold what their owner wrote, kept whole: what acceptrun shows,
# quotes, archives or exports from them is redacted on the way out.
# fmt: off
KEPT_WHOLE: tuple[KeptWhole, ...] = (
    KeptWhole("runs/*/attempts/*/stdout.log", "the workload's own output, kept whole for its owner"),
    KeptWhole("runs/*/attempts/*/stderr.log", "the workload's own output, kept whole for its owner"),
    KeptWhole("runs/*/spec.toml", "the user's spec as written: resume needs the real mirror URL"),
    KeptWhole("runs/*/git.diff", "the user's uncommitted code, as it was"),
    KeptWhole("secrets/*.json", "the spec's secret fields, 0600 in a 0700 directory, outside every run"),
    KeptWhole("queue/specs/job-*.toml", "the spec a queued job runs, as the user submitted it"),
)

_TEMP = "a temporary file of acceptrun's own, removed after use; no record data"
_LOCK = "an empty lock file (flock); nothing is written to it"
_CGROUP = "a cgroup control file: a pid or '1', no record data"
_TENSORS = "checkpoint payload bytes (tensors, state) the workload handed over, copied as they are"
_WARN = "a warning naming a path and an OSError, on stderr of a process whose stderr is a log acceptrun redacts when it shows it"
_CLI_OUT = "the CLI's stdout/stderr: RedactingStream (cli.main) redacts every write"

# Keyed by "module:qualified.name" of the function holding the sink call (or "<module>").
SINKS: tuple[Sink, ...] = (
    # -- the durable writers: every record file -------------------------------------------
    Sink("acceptrun._util.durable:write_atomic", "file", redacted_by="redact_text (unless raw=True: registered per caller)"),
    Sink("acceptrun._util.durable:write_json_atomic", "file", redacted_by="redact_record (unless raw=True)"),
    Sink("acceptrun._util.durable:append_jsonl", "file", redacted_by="redact_record (jsonl_line)"),
    Sink("acceptrun._util.durable:_write_appended", "file", redacted_by="its callers' jsonl_line (redact_record)"),
    Sink("acceptrun._util.durable:AppendLog._write", "file", redacted_by="redact_record (jsonl_line)"),
    Sink("acceptrun._util.logpump:main", "file", redacted_by="redact_text, line by line"),
    Sink("acceptrun._util.logpump:start", "process", exempt="the pump gets acceptrun's own environment and a path; what it writes it redacts"),
    Sink("acceptrun._util.outputs:write_output", "file", redacted_by="write_atomic's redact_text (raw=True only where its caller registers why)"),
    Sink("acceptrun._util.secret_shapes:_write_cache", "file", exempt="raw=True: detect-secrets' public rule patterns as translated for RE2, in the user's cache directory; no record data"),
    Sink("acceptrun.record.stepwriter:StepWriter._open_segment", "file", exempt="creates an empty segment; its lines go through StepWriter._write_all"),
    Sink("acceptrun.record.stepwriter:StepWriter._write_all", "file", exempt="step numbers and metric values (floats) the workload logged; no free text"),
    Sink("acceptrun.record.workspace:Workspace.create_run", "file", exempt="raw=True: the frozen spec.toml, KEPT_WHOLE"),
    Sink("acceptrun.record.registry:_locked", "file", exempt=_LOCK),
    Sink("acceptrun.record.registry:_warn", "terminal", exempt=_WARN),
    Sink("acceptrun.record.lease:SupervisorLease._write", "terminal", exempt=_WARN),
    Sink("acceptrun.run.lifecycle:_resume_lock", "file", exempt=_LOCK),
    Sink("acceptrun.cli.run:cmd_init", "file", exempt="raw=True: a new spec for the user, from their answers; nothing from a record"),
    Sink("acceptrun.run.reproduce:prepare", "file", exempt="raw=True: the spec to run again, the user's own (its secrets are needed to run)"),
    Sink("acceptrun.run.drills.restore:_scratch_copy", "file", exempt="a scratch copy of a checkpoint's files for a drill, removed after it"),
    Sink("acceptrun.run.drills.campaign.outside:run_outside", "process", exempt="`acceptrun run` and `acceptrun resume` of the user's own spec, as the user would start them, for a fault fired at the supervisor"),
    Sink("acceptrun.workload.inject:_damage", "file", exempt="an injected fault (cktrunc, ckflip): cuts or inverts bytes of the run's own checkpoint file; writes no text"),
    Sink("acceptrun.workload.inject:_mirror_gone", "file", exempt="an injected fault (mirrorgone): an empty file in place of the run's own mirror root for a while; writes no text"),
    Sink("acceptrun.workload.inject:_change_data", "file", exempt="an injected fault (datachange): inverts one byte of the campaign's scratch copy of the data; writes no text"),
    Sink("acceptrun.workload.inject:_change_package", "file", exempt="an injected fault (pkgchange): the version line of the campaign's scratch package's METADATA; no other text"),
    Sink("acceptrun.run.drills.campaign.scratch:scratch_spec", "file", exempt="the campaign's scratch folder in the workspace, removed after the kind's run: a marker line and the user's spec frozen (to_toml: the user's own file's values, which the run needs)"),
    Sink("acceptrun.run.drills.campaign.scratch:_copy_data", "file", exempt="a byte copy of the user's data into the campaign's scratch folder; no text of acceptrun's"),
    Sink("acceptrun.run.drills.campaign.scratch:_scratch_package", "file", exempt="the scratch package: a marker line and a METADATA of a fixed name and version"),
    Sink("acceptrun.notify.secrets:keep_secrets", "file", exempt="raw=True: secrets/<run>.json, KEPT_WHOLE (0600)"),
    # -- the supervisor and the workload -----------------------------------------------
    Sink("acceptrun.supervisor.process:ChildProcess._popen", "process", exempt="the user's workload, started with the environment and argv the user gave it"),
    Sink("acceptrun.supervisor.process:ChildProcess._log_lost", "terminal", exempt=_WARN),
    Sink("acceptrun.supervisor.process:ChildProcess.release", "file", redacted_by="as ChildProcess._open_log: a standby's held output, written to its logs (KEPT_WHOLE) and echoed through LiveEcho once it becomes an attempt"),
    Sink("acceptrun.supervisor.process:ChildProcess._open_log", "file", redacted_by="(the log ChildProcess._tee writes to) LiveEcho for the live echo of `acceptrun run` without -q (redact_text of each line, an unfinished line's last three words held for the next chunk, a key block held whole, then its controls escaped); stdout.log/stderr.log are KEPT_WHOLE"),
    Sink("acceptrun.supervisor.standby:StandbyKeeper.go", "socket", exempt="the go line (an attempt number and a checkpoint path of the run's own store) to the run's standby process, over a socket pair it inherited: it never leaves the machine"),
    Sink("acceptrun.workload.standby:_receive_go", "socket", exempt="a fixed 'ready' line to the supervisor over the socket pair the standby inherited"),
    Sink("acceptrun.supervisor.hang:stop_hung", "file", redacted_by="redact_file (stack dumps, py-spy's included, rewritten through the redactor)"),
    Sink("acceptrun.supervisor.containment:Containment.before_fork", "file", exempt=_CGROUP),
    Sink("acceptrun.supervisor.containment:Containment.close", "terminal", exempt=_WARN),
    Sink("acceptrun.supervisor.containment:_cgroup_kill", "file", exempt=_CGROUP),
    Sink("acceptrun.supervisor._watchdog:_kill_cgroup", "file", exempt=_CGROUP),
    Sink("acceptrun.supervisor._watchdog:_event", "file", exempt="a fixed event (kind, pids, signal numbers) from the watchdog, which imports nothing of acceptrun"),
    Sink("acceptrun.supervisor.lease:Watchdog.start", "process", exempt="acceptrun's own watchdog: pids and paths in argv, acceptrun's environment"),
    Sink("acceptrun.workload.watch:WorkloadWatch._start_watch_aids", "file", exempt="faulthandler writes stacks.txt from C in a signal handler; supervisor/hang.py's stop_hung rewrites it through redact_file once collected"),
    Sink("acceptrun.workload.run:Run.output.write", "file", exempt="Run.output: a file the workload names, copied as it is into the record's outputs"),
    Sink("acceptrun.workload.signals:StopHandling._watch_stop_wait", "terminal", exempt="the workload's own stderr (stderr.log, KEPT_WHOLE): a rank and a step number"),
    Sink("acceptrun.workload.slurm_step:main", "terminal", exempt="a Slurm step's stderr: exit codes and paths"),
    Sink("acceptrun.capture.preflight:storage_smoke", "file", exempt="a smoke test's payload of zeros, removed after"),
    Sink("acceptrun.capture.provenance:_git_part", "file", exempt="git.diff: the user's code, KEPT_WHOLE"),
    Sink("acceptrun.capture.provenance:_start_probe", "process", exempt="acceptrun's own probe, under the job's interpreter and environment"),
    Sink("acceptrun.capture.reverify:list_packages", "process", exempt="acceptrun's own probe (--packages) under the job's interpreter and environment, as preflight's"),
    Sink("acceptrun.capture._probe:cached_environment", "file", exempt="the probe's cache of package versions, devices and a fixed list of device variables (KEY_ENV); what reaches the record goes through write_json_atomic"),
    Sink("acceptrun.capture._probe:main", "file", exempt="the probe's answer to its parent on a pipe (the same data as its cache)"),
    Sink("acceptrun._util.git:run_git", "process", exempt="git, with the user's environment, in the user's repository"),
    # -- checkpoints -----------------------------------------------------------------------
    Sink("acceptrun.checkpoint.dcp_storage:DCPWriter._commit", "file", exempt=_TENSORS),
    Sink("acceptrun.checkpoint.files:_copy_checked", "file", exempt=_TENSORS),
    Sink("acceptrun.checkpoint.mirror_remote:put_checked", "file", exempt=_TENSORS),
    Sink("acceptrun.checkpoint.mirror_remote:_get_checked", "file", exempt=_TENSORS),
    Sink("acceptrun.checkpoint.writer:CheckpointWriter.write_json", "file", exempt="the workload's own checkpoint metadata, stored with its tensors"),
    Sink("acceptrun.checkpoint.store:CheckpointStore._commit", "file", exempt="raw=True: MANIFEST.json, whose digest covers its exact text (names, sizes, hashes)"),
    Sink("acceptrun.checkpoint.memtier:MemoryTier.adopt", "file", exempt="a committed checkpoint's files copied as they are into the run's memory tier (host shared memory, mode 0700), their hashes checked against its manifest"),
    Sink("acceptrun.checkpoint.store:CheckpointStore.redate", "file", exempt="raw=True: MANIFEST.json again, and checkpoint files copied as they are"),
    Sink("acceptrun.checkpoint.sharded.saving:AsyncSave._run", "terminal", exempt=_WARN),
    Sink("acceptrun.checkpoint.sharded.saving:_emit", "terminal", exempt=_WARN),
    Sink("acceptrun.checkpoint.sharded.saving:_wait_at_exit", "terminal", exempt=_WARN),
    # -- notifications: redacted at the moment they are encoded ---------------------------
    Sink("acceptrun.notify.notifier:Dispatcher._deliver", "socket", redacted_by="Target.send (json_body, email_message, command_env)"),
    Sink("acceptrun.notify.targets:WebhookTarget.send", "http", redacted_by="json_body"),
    Sink("acceptrun.supervisor.notice:_get", "http", exempt="sends nothing of the run: a GET (and IMDSv2's token PUT) to the cloud's metadata service for its preemption notice"),
    Sink("acceptrun.notify.targets:EmailTarget.send", "message", redacted_by="email_message"),
    Sink("acceptrun.notify.targets:CommandTarget.send", "process", redacted_by="command_env and json_body (argv: the spec's notify.command as written)"),
    # -- reports, the board, exports ------------------------------------------------------
    Sink("acceptrun.report.bundle:_Writer.add", "archive", redacted_by="redact_text (every member's text, in bundle._Writer's callers)"),
    Sink("acceptrun.report.bundle:build_bundle", "archive", redacted_by="redact_text (README, MANIFEST of redacted members)"),
    Sink("acceptrun.report.bundle:build_bundle.write", "archive", exempt="tars the members written above, already redacted"),
    Sink("acceptrun.ui.server:BoardHandler._send", "socket", redacted_by="ui.server._redacted (redact_text of every text body; the logs page redacts before it escapes)"),
    Sink("acceptrun.ui.server:BoardHandler._stream", "socket", redacted_by="ui.server._redacted, and live.log_feed redacts each line before JSON encodes it"),
    Sink("acceptrun.ui.server:_start_resume", "process", redacted_by="logpump.start (the resume's output, through redact_text into its log)"),
    Sink("acceptrun.cli.main:_main", "terminal", exempt=_CLI_OUT),
    Sink("acceptrun.cli.backends:cmd_export_skypilot", "terminal", exempt=_CLI_OUT),
    Sink("acceptrun.cli.backends:cmd_export_kubernetes", "terminal", exempt="the manifests, whose [env] secrets go to a 0600 Secret file (raw=True) by design; the rest through the CLI's RedactingStream"),
    Sink("acceptrun.backends.kubernetes_node:run_node", "process", exempt="the node's own `acceptrun run`, with the pod's environment"),
    Sink("acceptrun.backends.mlflow:_Progress.advance", "terminal", exempt="a count of files exported, on stderr"),
    Sink("acceptrun.backends.mlflow:_log_artifacts", "file", redacted_by="redact_spec (the spec artifact is written from the redacted spec)"),
    Sink("acceptrun.backends.ship:pack_wheel", "archive", exempt="a wheel of acceptrun's own code, for a remote job"),
    Sink("acceptrun.backends.ship:write_wheel", "file", exempt="raw=True: the wheel's bytes"),
    Sink("acceptrun.backends.ship:build_wheel", "file", exempt="acceptrun's own package files, copied into a wheel"),
    Sink("acceptrun.backends.slurm:submit", "file", exempt="raw=True: the frozen spec the job runs (it needs the real mirror)"),
    Sink("acceptrun.backends.slurm:_slurm", "process", exempt="sbatch/squeue/scancel with the user's environment"),
    Sink("acceptrun.queue.worker:Worker._start", "process", redacted_by="logpump.start (a job's output, through redact_text into its log); the job spec is raw=True, KEPT_WHOLE"),
    # -- tuning helpers: scratch files in a temporary directory ----------------------------
    Sink("acceptrun.tune.comm:run_comm", "process", exempt="a collective benchmark's workers: a job of sizes, logs in a temporary directory"),
    Sink("acceptrun.tune.comm:_run_across_nodes", "process", exempt="the same benchmark across nodes: its job file holds sizes"),
    Sink("acceptrun.tune.comm:main", "terminal", exempt="a benchmark worker's result line"),
    Sink("acceptrun.tune.scaling:run_scaling", "file", exempt=_TEMP),
    Sink("acceptrun.tune.sweep:run_child", "process", exempt="a trial of the user's spec, its log in the sweep's own directory (the trial's stdout/stderr, its own output)"),
    Sink("acceptrun.cli.tune:cmd_tune", "terminal", exempt=_CLI_OUT),
    Sink("acceptrun.tune.trial:main", "terminal", exempt="a trial's result line (numbers), read by the sweep"),
)

# fmt: on

_BY_WHERE = {s.where: s for s in SINKS}


def sink(where: str) -> Sink | None:
    """The registration of the function ``where`` ("module:qualified.name"), or None."""
    return _BY_WHERE.get(where)


# ---- redact, then encode ------------------------------------------------------------------


def json_body(obj: Any, *, indent: int | None = None) -> bytes:
    """``obj`` as JSON bytes, every string redacted before it is encoded."""
    return json.dumps(redact_record(obj), sort_keys=True, indent=indent).encode()


def email_message(*, sender: str, to: Iterable[str], subject: str, body: str) -> EmailMessage:
    """An e-mail whose headers and body were redacted before MIME encodes them."""
    mail = EmailMessage()
    mail["Subject"] = redact_text(subject)
    mail["From"] = sender
    mail["To"] = ", ".join(to)
    mail.set_content(redact_text(body))
    return mail


# Variables a desktop command (notify-send) needs, whose names only look secret.
_PLUMBING = frozenset({"DBUS_SESSION_BUS_ADDRESS"})


def command_env(base: Mapping[str, str], fields: Mapping[str, Any]) -> dict[str, str]:
    """The environment of a command acceptrun sends a message to.

    ``base`` (acceptrun's own) without the variables whose name or value looks secret (the
    command is told about the run; it is not handed the run's credentials), plus
    ``fields`` (``ACCEPTRUN_NOTIFY_TITLE`` ...), each redacted.
    """
    env = {
        k: v
        for k, v in base.items()
        if k in _PLUMBING or (not is_secret_name(k) and redact_text(v) == v)
    }
    env.update({k: redact_text("" if v is None else str(v)) for k, v in fields.items()})
    return env


def redact_file(path: Path) -> None:
    """Rewrite a text file acceptrun collected raw (a stack dump) through the redactor."""
    try:
        text = read_bytes_bounded(path).decode("utf-8", errors="replace")
    except OSError:
        return  # nothing was collected
    write_atomic(path, text)  # redact_text, then temp + fsync + rename


def redact_lines(lines: Iterable[str]) -> Iterator[str]:
    """Each line of ``lines`` redacted, a key block (``-----BEGIN ...-----``, its body,
    ``-----END ...-----``) as one piece (:class:`~acceptrun._util.keyblock.KeyBlocks`). A
    block whose body goes past :data:`BLOCK_MAX` characters, or ends without its END line,
    is given as its BEGIN line and ``<redacted>``, and the rest of its body is left out."""
    blocks = KeyBlocks()
    for line in lines:
        shown = blocks.line(line)
        if shown:
            yield shown
    tail = blocks.close()  # the input ended inside a block
    if tail:
        yield tail
