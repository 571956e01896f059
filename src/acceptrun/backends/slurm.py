"""The Slurm backend: a run as a batch job whose allocation runs the supervisor.

::

    job = submit(Path("spec.toml"), workspace)          # sbatch; the run id is fixed now
    jobs(workspace)    # [{"job": "42", "run_id": ..., "state": "RUNNING", ...}]
    cancel(workspace, "42")                             # graceful: checkpoint, then stop

``submit`` validates the spec, freezes it and writes a batch script under
``<workspace>/slurm/<run_id>/``, then records the job in ``<workspace>/slurm_jobs.jsonl``.
The script starts ``acceptrun run SPEC --run-id RUN`` inside the allocation, so the run
record's path is known at submit time; Slurm's own output files are hard-linked into the
record as soon as it exists (``slurm-<job>.out``, ``slurm-<job>.err``).

Preemption and time limits: the job is submitted with ``--requeue`` and
``--signal=B:USR1@<slurm.signal_grace>``. The batch shell turns that USR1 into SIGTERM to
the supervisor, which stops the workload gracefully (it checkpoints and exits 143); once
the supervisor has closed the run, the script calls ``scontrol requeue`` on its own job.
A requeued job (``SLURM_RESTART_COUNT > 0``) runs ``acceptrun resume RUN`` instead, from
the newest checkpoint that verifies in the shared run record. ``scontrol requeue`` from
outside (or a preemption that requeues) sends SIGTERM to every process of the job: the
supervisor stops the run the same way, and the next allocation resumes it.

Multi-node (``resources.nodes = N > 1``): one job of N nodes (``--nodes=N
--ntasks-per-node=1``). The batch script still runs ONE supervisor, on the first node;
its workload command is one srun step across all N nodes with one torchrun per node
(acceptrun.workload.distributed, acceptrun.workload.slurm_step), so the grace signal
reaches srun, which forwards it to every node's torchrun and ranks, and a restart after a
node failure is a new srun step inside the same allocation, from the newest sharded
checkpoint every rank committed.

Between the two allocations the record is closed as it stood (status ``finished``, the
last attempt ``stopped``); the resume reopens it with attempt N+1 and closes it again
with the final verdict.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from acceptrun._util.durable import append_jsonl, read_jsonl, write_atomic, write_json_atomic
from acceptrun.errors import UserError
from acceptrun.record.workspace import RunRecord, Workspace, new_run_id, now_iso, user_at_host
from acceptrun.spec.model import RunSpec, format_duration, load_spec

__all__ = ["JOBS_FILE", "SlurmJob", "batch_script", "cancel", "jobs", "submit"]

JOBS_FILE = "slurm_jobs.jsonl"  # in the workspace root: one line per submitted job
SLURM_TIMEOUT_S = 60.0  # seconds a Slurm client command may take (a busy slurmctld is slow)
MAX_SIGNAL_S = 65535  # sbatch --signal accepts at most this many seconds
ACTIVE_STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED")
_FIELDS = ("job", "state", "reason", "submitted", "slurm_priority")
_SQUEUE_FORMAT = "%i|%T|%r|%V|%Q"


@dataclass
class SlurmJob:
    """A submitted batch job and the run it will create."""

    job_id: str
    run_id: str | None
    script: Path


# ---- submit -----------------------------------------------------------------------------------


def submit(spec_path: Path, workspace: Workspace, *, priority: int = 0) -> SlurmJob:
    """Submit a spec as a Slurm batch job; returns the job, its run id and its script.

    ``priority`` above 0 asks Slurm to start the job sooner (``--nice=-N``, which Slurm
    allows its operators only); below 0 later (``--nice=N``, allowed to everyone).
    Raises :class:`UserError` for a spec Slurm cannot run or when sbatch refuses the job.

    >>> job = submit(Path("spec.toml"), find_workspace(create=True))
    >>> job.job_id, job.run_id
    ('42', '20261130-021500-charlm-3f2a')
    """
    spec = load_spec(spec_path)
    from acceptrun.capture.preflight import check_static

    check_static(spec)
    _check_spec(spec)
    sbatch = _tool("sbatch")
    run_id = new_run_id(spec.name)
    job_dir = workspace.root / "slurm" / run_id
    job_dir.mkdir(parents=True)
    try:
        # What is queued is what runs: the spec frozen now, paths resolved.
        frozen = job_dir / "spec.toml"
        write_atomic(frozen, spec.to_toml(), raw=True)  # the real mirror, for the job
        script = job_dir / "job.sbatch"
        text = batch_script(
            spec, workspace=workspace, run_id=run_id, spec_file=frozen, job_dir=job_dir,
            priority=priority,
        )  # fmt: skip
        write_atomic(script, text, mode=0o755)
        proc = _slurm([sbatch, "--parsable", str(script)], cwd=spec.workdir_path)
        if proc.returncode != 0:
            raise UserError(
                f"sbatch refused the job for spec {spec.source}: {_err(proc)}; "
                f"check the [slurm] section (partition, account, qos, extra_args) and {script}"
            )
    except BaseException:
        shutil.rmtree(job_dir, ignore_errors=True)  # nothing queued: leave nothing behind
        raise
    job_id = proc.stdout.strip().split(";")[0]  # "42" or "42;cluster"
    append_jsonl(
        workspace.root / JOBS_FILE,
        {
            "kind": "submit", "job": job_id, "run_id": run_id, "name": spec.name,
            "priority": priority, "submitted_at": now_iso(), "by": user_at_host(),
            "spec": str(Path(spec_path).resolve()), "script": str(script),
            "record": str(workspace.runs_dir / run_id),
        },
        sync=True,
    )  # fmt: skip
    return SlurmJob(job_id=job_id, run_id=run_id, script=script)


def _check_spec(spec: RunSpec) -> None:
    """What Slurm cannot run as asked; each message says the field and the fix."""
    if spec.resources.nodes > 1 and (spec.shell or not spec.command):
        raise UserError(
            f"resources.nodes = {spec.resources.nodes} with command {spec.command!r}: a "
            "multi-node run needs the command as a list, e.g. command = "
            '["python", "train.py"] (acceptrun adds srun and torchrun)'
        )
    grace, stop = spec.slurm.signal_grace, spec.limits.grace_period
    if grace > MAX_SIGNAL_S:
        raise UserError(
            f"slurm.signal_grace = {format_duration(grace)}: sbatch --signal accepts at most "
            f'{MAX_SIGNAL_S} s; use a shorter one, e.g. "5m"'
        )
    if stop >= grace:
        raise UserError(
            f"limits.grace_period = {format_duration(stop)} is not shorter than "
            f"slurm.signal_grace = {format_duration(grace)}: Slurm would end the job before "
            "the workload has checkpointed. Raise slurm.signal_grace or lower "
            "limits.grace_period"
        )
    wall = spec.limits.wall_time
    if wall is not None and grace >= wall:
        raise UserError(
            f"slurm.signal_grace = {format_duration(grace)} is not shorter than "
            f"limits.wall_time = {format_duration(wall)}: the stop signal would come at the "
            "start. Lower slurm.signal_grace or raise limits.wall_time"
        )


def batch_script(
    spec: RunSpec,
    *,
    workspace: Workspace,
    run_id: str,
    spec_file: Path,
    job_dir: Path,
    priority: int = 0,
) -> str:
    """The sbatch script of a run: options from the spec, a body that runs the supervisor."""
    q = shlex.quote
    out, err = job_dir / "slurm-%j.out", job_dir / "slurm-%j.err"
    options = [
        f"--job-name={_job_name(spec.name)}",
        f"--output={out}",
        f"--error={err}",
        "--open-mode=append",  # a requeued job appends to the same files
        f"--chdir={spec.workdir_path}",
        *(
            [f"--nodes={spec.resources.nodes}", "--ntasks-per-node=1"]
            if spec.resources.nodes > 1
            else ["--nodes=1", "--ntasks=1"]
        ),
        "--requeue",
        f"--signal=B:USR1@{math.ceil(spec.slurm.signal_grace)}",
        f"--comment=acceptrun:{run_id}",
    ]
    res = spec.resources
    if res.gpus:
        options.append(f"--gres=gpu:{res.gpus}")
    if res.cpus:
        options.append(f"--cpus-per-task={res.cpus}")
    if res.memory_gb:
        options.append(f"--mem={math.ceil(res.memory_gb * 1024)}M")
    if spec.limits.wall_time is not None:
        options.append(f"--time={_slurm_time(spec.limits.wall_time)}")
    for name in ("partition", "account", "qos"):
        value = getattr(spec.slurm, name)
        if value:
            options.append(f"--{name}={value}")
    if priority:
        options.append(f"--nice={-priority}")
    options.extend(spec.slurm.extra_args)
    header = "\n".join(f"#SBATCH {_sbatch_quote(o)}" for o in options)
    record = workspace.runs_dir / run_id
    return _BODY.format(
        header=header,
        name=spec.name,
        run_id=q(run_id),
        spec=q(str(spec_file)),
        python=q(sys.executable),
        workspace=q(str(workspace.root)),
        record=q(str(record)),
        job_dir=q(str(job_dir)),
    )


# The batch job. Runs under bash (the #! line); every value above is shell-quoted.
_BODY = """\
#!/bin/bash
# acceptrun batch job for spec {name!r}: `acceptrun run` in the allocation, `acceptrun
# resume` after a requeue. Written by acceptrun.backends.slurm; edit the spec, not this.
{header}

set -u
RUN_ID={run_id}
SPEC={spec}
RECORD={record}
JOB_DIR={job_dir}
ACCEPTRUN=({python} -m acceptrun --workspace {workspace})
restarts=${{SLURM_RESTART_COUNT:-0}}
echo "acceptrun: slurm job $SLURM_JOB_ID (restart $restarts) on $(hostname) at $(date -u +%FT%TZ)"

# Slurm's output files live beside this script; they are hard-linked into the run record
# as soon as the record exists (copied at the end where a link is impossible).
link_output() {{
  for ext in out err; do
    src="$JOB_DIR/slurm-$SLURM_JOB_ID.$ext"
    dst="$RECORD/slurm-$SLURM_JOB_ID.$ext"
    [ -e "$dst" ] || ln "$src" "$dst" 2>/dev/null || [ "${{1:-}}" != copy ] || cp "$src" "$dst"
  done
}}
( for _ in $(seq 86400); do [ -f "$RECORD/run.json" ] && {{ link_output; exit 0; }}; sleep 1; done ) &
linker=$!

if [ "$restarts" -gt 0 ] && [ -f "$RECORD/run.json" ]; then
  if {python} -c 'import json, sys; sys.exit(json.load(open(sys.argv[1])).get("verdict") != "accepted")' "$RECORD/run.json"; then
    echo "acceptrun: run $RUN_ID was already accepted; nothing to resume"
    kill "$linker" 2>/dev/null
    exit 0
  fi
  # Requeued: the previous allocation is gone (--force: it ran on another node), and a
  # run stopped before its first checkpoint starts again from step 0 (--from-scratch).
  "${{ACCEPTRUN[@]}}" resume "$RUN_ID" --force --from-scratch \\
    --reason "slurm job $SLURM_JOB_ID requeued (restart $restarts)" &
else
  "${{ACCEPTRUN[@]}}" run "$SPEC" --run-id "$RUN_ID" &
fi
pid=$!

# USR1 (--signal=B:USR1@grace): the time limit is near. Stop the run gracefully (the
# supervisor checkpoints the workload), then requeue this job. SIGTERM (scancel, a
# requeue or a preemption) reaches every process of the job; it is passed on here too,
# and this shell waits for the supervisor to close the run before it exits.
requeue=0
trap 'requeue=1; echo "acceptrun: SIGUSR1 from Slurm: time limit near, stopping run $RUN_ID"; kill -TERM "$pid" 2>/dev/null' USR1
trap 'kill -TERM "$pid" 2>/dev/null' TERM
rc=0
while :; do
  wait "$pid"
  rc=$?
  kill -0 "$pid" 2>/dev/null || break
done
link_output copy
kill "$linker" 2>/dev/null
if [ "$requeue" = 1 ]; then
  echo "acceptrun: requeueing slurm job $SLURM_JOB_ID; the next allocation resumes run $RUN_ID"
  scontrol requeue "$SLURM_JOB_ID"
elif grep -qs "slurm job $SLURM_JOB_ID cancelled" "$RECORD/control.json"; then
  # `acceptrun cancel` of a multi-node job signalled this shell only (scancel --batch):
  # the run is closed, and the job ends as cancelled.
  echo "acceptrun: run $RUN_ID stopped; cancelling slurm job $SLURM_JOB_ID"
  scancel "$SLURM_JOB_ID"
fi
exit "$rc"
"""


def _job_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "acceptrun"


def _sbatch_quote(option: str) -> str:
    """An option for a ``#SBATCH`` line; values with spaces are double-quoted.

    A control character (a newline above all) would end the header line and put the rest
    of the value into the script's body as a command or a header of its own: refused.
    The spec refuses these in [slurm] and paths already; this holds for any caller.
    """
    if found := re.search(r"[\x00-\x1f\x7f]", option):
        raise UserError(
            f"sbatch option {option!r} holds the control character {found.group()!r}, which "
            "would break out of its #SBATCH line; remove it from the spec's [slurm] section, "
            "resources or workdir"
        )
    if not re.search(r"\s", option):
        return option
    name, sep, value = option.partition("=")
    return f'{name}="{value}"' if sep else f'"{option}"'


def _slurm_time(seconds: float) -> str:
    """``D-HH:MM:SS`` rounded up to the minute (Slurm counts time limits in minutes)."""
    minutes = max(1, math.ceil(seconds / 60))
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


# ---- jobs -------------------------------------------------------------------------------------


def jobs(workspace: Workspace) -> list[dict[str, Any]]:
    """The jobs this workspace submitted, oldest first, with Slurm's view of each.

    Each: ``{"job", "run_id", "name", "state", "priority", "submitted", "reason",
    "run_status", "script"}``. ``state`` is Slurm's (PENDING, RUNNING, COMPLETED,
    CANCELLED, FAILED, TIMEOUT, ...), read from squeue, else from sacct once slurmctld
    has forgotten the job, else ``UNKNOWN``; ``run_status`` is the run record's.
    """
    entries = _submitted(workspace)
    if not entries:
        return []
    ids = [e["job"] for e in entries]
    found = _squeue(ids)
    missing = [i for i in ids if i not in found]
    if missing:
        found.update(_sacct(missing))
    rows = []
    for e in entries:
        live = found.get(e["job"], {})
        record = RunRecord(workspace.runs_dir / e["run_id"])
        status = None
        if record.exists("run.json"):
            status = record.state.get("status")
        rows.append(
            {
                "job": e["job"],
                "run_id": e["run_id"],
                "name": e.get("name", ""),
                "state": live.get("state", "UNKNOWN"),
                "priority": int(e.get("priority", 0)),
                "submitted": live.get("submitted") or e.get("submitted_at", ""),
                "reason": live.get("reason")
                or ("" if live else "no longer known to squeue or sacct"),
                "run_status": status,
                "script": e.get("script", ""),
            }
        )
    return rows


def _submitted(workspace: Workspace) -> list[dict[str, Any]]:
    path = workspace.root / JOBS_FILE
    if not path.exists():
        return []
    return [e for e in read_jsonl(path) if e.get("kind") == "submit" and e.get("job")]


def _squeue(ids: list[str]) -> dict[str, dict[str, Any]]:
    """Jobs slurmctld still knows (finished ones for MinJobAge seconds)."""
    squeue = _tool("squeue")
    proc = _slurm(
        [squeue, "--states=all", "--noheader", f"--jobs={','.join(ids)}", "-o", _SQUEUE_FORMAT]
    )
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return {}  # none of them is known any more
        raise UserError(f"squeue failed: {_err(proc)}; is the cluster reachable (`sinfo`)?")
    found: dict[str, dict[str, Any]] = {}
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != len(_FIELDS):
            continue
        row = dict(zip(_FIELDS, parts, strict=True))
        row["reason"] = "" if row["reason"] == "None" else row["reason"]
        row["submitted"] = _iso(row["submitted"])
        found[row["job"]] = row
    return found


def _sacct(ids: list[str]) -> dict[str, dict[str, Any]]:
    """Finished jobs from accounting; nothing when the cluster keeps none."""
    sacct = shutil.which("sacct")
    if sacct is None:
        return {}
    proc = _slurm(
        [sacct, "-X", "-n", "-P", f"--jobs={','.join(ids)}", "-o", "JobIDRaw,State,Submit"]
    )
    found: dict[str, dict[str, Any]] = {}
    if proc.returncode != 0:
        return found
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0] in ids:
            # "CANCELLED by 0" -> "CANCELLED"
            found[parts[0]] = {"state": parts[1].split()[0], "submitted": _iso(parts[2])}
    return found


def _iso(stamp: str) -> str:
    """Slurm's local ``2026-11-30T02:02:47`` as UTC ISO-8601; unchanged if not a time."""
    try:
        return now_iso(datetime.fromisoformat(stamp).astimezone(UTC).timestamp())
    except ValueError:
        return stamp


# ---- cancel -----------------------------------------------------------------------------------


def cancel(workspace: Workspace, job: str) -> None:
    """Cancel a job of this workspace (a Slurm job id or its run id).

    A pending job leaves the queue. A running one is stopped gracefully: the run record
    gets an ``audit`` event and control.json (who cancelled), then ``scancel`` sends
    SIGTERM to the job; the supervisor stops the workload (checkpoint, exit) and closes
    the run as stopped. Slurm's KillWait must exceed ``limits.grace_period``.

    A running multi-node job gets SIGTERM in its batch shell only (``scancel --batch``):
    a SIGTERM to every process would reach srun, which SIGKILLs the step before the
    ranks checkpoint. The shell stops the supervisor, which stops every rank on every
    node through srun; once the run is closed the batch script cancels its own job.
    """
    entries = _submitted(workspace)
    entry = next((e for e in entries if job in (e["job"], e["run_id"])), None)
    if entry is None:
        known = ", ".join(f"{e['job']} ({e['run_id']})" for e in entries[-5:]) or "none"
        raise UserError(
            f"no Slurm job {job!r} was submitted from workspace {workspace.root}; "
            f"its jobs: {known}. List them with `acceptrun queue --backend slurm`"
        )
    job_id = entry["job"]
    state = _squeue([job_id]).get(job_id, {}).get("state")
    if state is not None and state not in ACTIVE_STATES:
        raise UserError(f"Slurm job {job_id} has already ended ({state}); nothing to cancel")
    record = RunRecord(workspace.runs_dir / entry["run_id"])
    if record.exists("run.json") and record.state.get("status") in ("preflight", "running"):
        who = user_at_host()
        reason = f"slurm job {job_id} cancelled"
        record.event("audit", sync=True, action="cancel", by=who, reason=reason, job=job_id)
        # The supervisor's signal handler reads it: a stop on request, not a preemption.
        control = {"action": "stop", "by": who, "at": now_iso(), "reason": reason}
        write_json_atomic(record.file("control.json"), control)
    graceful = state == "RUNNING" and _nodes(entry) > 1
    args = ["--batch", "--signal=TERM"] if graceful else []
    proc = _slurm([_tool("scancel"), *args, job_id])
    if proc.returncode != 0:
        raise UserError(f"scancel {job_id} failed: {_err(proc)}")
    append_jsonl(
        workspace.root / JOBS_FILE,
        {"kind": "cancel", "job": job_id, "at": now_iso(), "by": user_at_host()},
        sync=True,
    )


def _nodes(entry: dict[str, Any]) -> int:
    """The nodes a submitted job asked for, from its batch script (1 when unreadable)."""
    try:
        text = Path(entry.get("script", "")).read_text()
    except OSError:
        return 1
    found = re.search(r"^#SBATCH --nodes=(\d+)$", text, re.MULTILINE)
    return int(found.group(1)) if found else 1


# ---- helpers ----------------------------------------------------------------------------------


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise UserError(
            f"{name} not found on PATH: the Slurm backend needs Slurm's client commands "
            "(on a cluster: `module load slurm`; on Debian: `apt-get install slurm-client`)"
        )
    return path


def _slurm(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, cwd=cwd, env=dict(os.environ), capture_output=True, text=True,
            timeout=SLURM_TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise UserError(
            f"{Path(argv[0]).name} did not answer within {SLURM_TIMEOUT_S:.0f} s; "
            "slurmctld may be down or overloaded (try `sinfo`)"
        ) from None


def _err(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stderr or proc.stdout).strip() or f"exit {proc.returncode}"
