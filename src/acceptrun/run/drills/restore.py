"""The restore drill: prove that the latest checkpoint restores, in a fresh process.

``acceptrun ckpt drill RUN`` starts the run's own command again, in a new process, with
``ACCEPTRUN_RESUME_FROM`` set to the newest checkpoint that verifies and
``ACCEPTRUN_DRILL=restore``. The workload builds its model as it always does; the client
API restores the checkpoint in ``run.restore(...)``, lets ``run.steps()`` run exactly
one step, records a ``drill`` event with what it saw, and exits without saving or
logging anything into the run. ``--cpu`` hides the GPUs (``CUDA_VISIBLE_DEVICES=""``)
to prove the checkpoint restores on another kind of machine.

A sharded (FSDP2) script restores with ``sharded.load(run.checkpoint_store(), ...)``:
that load is each rank's restore, and in the drill the store is a scratch one, so the
step's ``sharded.save`` commits into ``<run>/.drill-checkpoints-<launch>`` (removed here
after the workload exits), never into the run's checkpoints. In a run of several
processes on one machine every rank must report its drill event.

The drill never changes the user's files: it runs in a scratch copy of the working
directory (``drills/<n>/workdir``, removed afterwards), so a script that truncates its
log, writes its model or saves outputs at start-up or in its one step writes into the
copy. Files too big to copy (over ``COPY_FILE_BYTES``, or past ``COPY_BUDGET_BYTES`` in
all) and virtual environments are symlinked instead: each such file, and every
registered output, is checked (size, mtime, inode) before and after, and a drill that
changed one fails, naming it.

A script that does not use the client API (a black box) but whose checkpoints are
watched (``checkpoint.watch``, captured into the store) is drilled as a restart would
resume it: the newest verified captured checkpoint is put back into the scratch copy
(each file at its path relative to the working directory), the command starts there
with ``checkpoint.resume_args`` ("{checkpoint}" = the restored path in the copy), and its
progress (``progress.pattern`` / ``progress.tensorboard``, read by
:class:`~acceptrun.supervisor.progress.ProgressReader` from the drill's own logs, step
events into ``drills/<n>/events.jsonl``) must show a step after the checkpoint's step
within ``timeout``. A first step before the checkpoint's step means the resume flag did
not take (it trained from scratch); an exit first, a divergence or the timeout also
fail. Once the step is seen the process group gets SIGTERM, then SIGKILL after
``STOP_GRACE_S``. Without a progress source, without ``resume_args``, or with a source
file outside the working directory, the drill refuses before anything runs.

The drill's result is an event in the run's events.jsonl, which the verdict reads.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acceptrun._util.paths import inside
from acceptrun.checkpoint.files import put_back, sources_of
from acceptrun.checkpoint.owner import open_run_store
from acceptrun.checkpoint.store import CheckpointInfo
from acceptrun.errors import AcceptrunError, UserError
from acceptrun.record.workspace import RunRecord, now_iso, user_at_host
from acceptrun.spec.model import RunSpec, load_spec
from acceptrun.supervisor.process import ChildProcess, contract_env
from acceptrun.workload.contract import DRILL_SCRATCH_PREFIX, ENV_DRILL

if TYPE_CHECKING:
    from acceptrun.supervisor.progress import ProgressReader

__all__ = ["DrillResult", "restore_drill"]

TAIL_BYTES = 2000  # of stderr kept as evidence when a drill fails
POLL_S = 0.1  # seconds between reads of a watched drill's logs (a seek and a short read)
STOP_GRACE_S = 5.0  # seconds between SIGTERM and SIGKILL once a watched drill has its proof
COPY_FILE_BYTES = 16 << 20  # a bigger file of the working directory is linked, not copied
COPY_BUDGET_BYTES = 512 << 20  # bytes copied into the scratch directory at most
# Linked whole: environments and caches a drill reads but has no reason to write.
_LINK_DIRS = frozenset({".venv", "venv", "node_modules", ".tox", ".mypy_cache", ".ruff_cache"})
_SKIP_DIRS = frozenset({".git", "__pycache__"})


@dataclass(frozen=True, slots=True)
class DrillResult:
    ok: bool
    step: int | None
    evidence: str
    seconds: float
    log_dir: Path


def _usage_kind(record: RunRecord, spec: RunSpec) -> str:
    """How the run's command uses the client: as recorded at launch, else read again."""
    from acceptrun.workload.usage import detect_usage

    usage = next(iter(record.events("usage")), None)
    kind = usage.get("usage") if usage is not None else None
    return str(kind) if kind is not None else detect_usage(spec).kind


def _refuse_black_box(record: RunRecord, spec: RunSpec) -> None:
    """A script without the client and without watched checkpoints has nothing to restore."""
    from acceptrun.workload.usage import BLACK_BOX

    kind = _usage_kind(record, spec)
    if kind == BLACK_BOX and not spec.checkpoint.watch:
        raise UserError(
            f"run {record.run_id} is a black box (its script does not use the client API) and "
            "its spec watches no checkpoint: there is nothing acceptrun could restore. Set "
            "checkpoint.watch and checkpoint.resume_args in the spec, or use the client API "
            "(run.restore, run.maybe_checkpoint), then run it again"
        )


def restore_drill(
    record: RunRecord, *, cpu: bool = False, timeout: float = 600.0, echo: bool = False
) -> DrillResult:
    """Restore the newest verified checkpoint of ``record`` in a fresh process; record the result."""
    spec = load_spec(record.spec_path)
    _refuse_black_box(record, spec)
    store = open_run_store(record, spec, retention=False)  # the run's own, owner checked
    ckpt_dir = store.root
    info = store.latest_verified(quarantine=False)
    if info is None:
        raise UserError(
            f"run {record.run_id} has no checkpoint that verifies in {ckpt_dir}; "
            "a restore drill needs one (see `acceptrun ckpt ls`)"
        )
    # A black box's own (captured) checkpoint: put back and resumed as a restart would.
    plan = _watched_plan(record, spec, info) if _is_watched(record, spec, info) else None
    drills = record.path / "drills"
    n = 1 + sum(1 for _ in drills.iterdir()) if drills.is_dir() else 1
    log_dir = drills / str(n)
    log_dir.mkdir(parents=True)
    # Attempt 0: not an attempt of the run.
    env = contract_env(
        os.environ, spec, record, attempt=0, resume_from=str(info.path), checkpoint_dir=ckpt_dir
    )
    env[ENV_DRILL] = "restore"
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    record.audit("drill", drill="restore", step=info.step, cpu=cpu)
    record.event(
        "drill_start", sync=True, drill="restore", step=info.step, cpu=cpu, by=user_at_host(),
        source="client" if plan is None else "watched",
    )  # fmt: skip
    scratch = log_dir / "workdir"
    skip = {record.path.parent.parent.resolve(), ckpt_dir.resolve()}  # workspace, checkpoints
    linked = _scratch_copy(spec.workdir_path, scratch, skip)
    watched = _output_paths(record) + linked
    before_stat = {p: _stat(p) for p in watched}
    if plan is not None:
        result = _watched_restore(
            record, spec, info, plan, env, scratch, log_dir, cpu, timeout, echo
        )
    else:
        result = _client_restore(record, spec, info, env, scratch, log_dir, cpu, timeout, echo)
    return _finish(record, n, info, cpu, result, watched, before_stat)


def _watched_restore(
    record: RunRecord,
    spec: RunSpec,
    info: CheckpointInfo,
    plan: dict[str, str],
    env: dict[str, str],
    scratch: Path,
    log_dir: Path,
    cpu: bool,
    timeout: float,
    echo: bool,
) -> DrillResult:
    """Drill a black box's captured checkpoint in ``scratch`` (removed after); record the event."""
    t0 = time.monotonic()
    try:
        ok, evidence = _watched_drill(
            spec, info, plan, env, scratch, log_dir, timeout=timeout, echo=echo
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.monotonic() - t0
    evidence += f"{' with GPUs hidden' if cpu else ''}; {seconds:.1f}s in all"
    record.event(
        "drill", sync=True, drill="restore", ok=ok, step=info.step, evidence=evidence,
        source="watched",
    )  # fmt: skip
    return DrillResult(ok, info.step, evidence, seconds, log_dir)


def _client_restore(
    record: RunRecord,
    spec: RunSpec,
    info: CheckpointInfo,
    env: dict[str, str],
    scratch: Path,
    log_dir: Path,
    cpu: bool,
    timeout: float,
    echo: bool,
) -> DrillResult:
    """Run a client workload's drill in ``scratch`` and judge the drill events it reported."""
    # The run's own launch: through torchrun with resources.processes > 1, since a
    # checkpoint restores only with the number of processes that saved it.
    from acceptrun.workload.distributed import launch_command

    before = sum(1 for _ in record.events("drill"))
    # A sharded script's saves during the drill commit into scratch stores in the record
    # (workload/checkpointing.py, _drill_store); those this drill made are removed after it.
    stores_before = set(record.path.glob(f"{DRILL_SCRATCH_PREFIX}*"))
    t0 = time.monotonic()
    try:
        child = ChildProcess(
            launch_command(spec, env),
            cwd=scratch,
            env=env,
            stdout_path=log_dir / "stdout.log",
            stderr_path=log_dir / "stderr.log",
            echo=echo,
        )
        child.start()
        rc = child.wait(timeout)
        if rc is None:
            child.signal_group(9)
            rc = child.wait(10)
        child.finish()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        for made in set(record.path.glob(f"{DRILL_SCRATCH_PREFIX}*")) - stores_before:
            shutil.rmtree(made, ignore_errors=True)
    seconds = time.monotonic() - t0
    reported = list(record.events("drill"))[before:]
    if reported:
        ok, evidence = _judge_reported(spec, reported, rc, cpu, seconds)
        return DrillResult(ok, info.step, evidence, seconds, log_dir)
    why = "timed out" if seconds >= timeout else f"exited {rc}"
    evidence = (
        f"the workload {why} without reporting a drill ({_last_line(log_dir)}); it must call "
        "run.restore(...) (or sharded.load(run.checkpoint_store(), ...)) and loop with "
        "run.steps(...)"
    )
    record.event("drill", sync=True, drill="restore", ok=False, step=info.step, evidence=evidence)
    return DrillResult(False, info.step, evidence, seconds, log_dir)


def _judge_reported(
    spec: RunSpec, reported: list[dict[str, Any]], rc: int | None, cpu: bool, seconds: float
) -> tuple[bool, str]:
    """(ok, evidence) from the drill events the workload's ranks wrote and its exit status."""
    # One drill event per rank in a multi-process run (rank 0's tells the story).
    last = next((e for e in reported if e.get("rank", 0) == 0), reported[-1])
    ok = all(bool(e.get("ok")) for e in reported) and rc == 0
    ranks = f" on {len(reported)} ranks" if len(reported) > 1 else ""
    missing = _silent_ranks(spec, reported)
    if missing:
        ok = False
        which = f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
        ranks = (
            f" on {len(reported)} of {spec.resources.processes} ranks ({which} reported "
            "no drill: every rank must restore)"
        )
    evidence = (
        f"{last.get('evidence')}{ranks}{' with GPUs hidden' if cpu else ''}; {seconds:.1f}s in all"
    )
    if not ok and rc != 0:
        evidence += f"; exit {rc}"
    return ok, evidence


def _silent_ranks(spec: RunSpec, reported: list[dict[str, Any]]) -> list[int]:
    """The ranks of a one-machine multi-process run that wrote no drill event."""
    processes = spec.resources.processes
    if processes <= 1 or spec.resources.nodes > 1:
        return []
    return sorted(set(range(processes)) - {int(e.get("rank", 0)) for e in reported})


def _finish(
    record: RunRecord,
    n: int,
    info: CheckpointInfo,
    cpu: bool,
    result: DrillResult,
    watched: list[Path],
    before_stat: dict[Path, tuple[int, int, int] | None],
) -> DrillResult:
    """Fail a drill that changed a file of the run outside its copy; write result.json."""
    seconds, log_dir = result.seconds, result.log_dir
    changed = [str(p) for p in watched if _stat(p) != before_stat[p]]
    if changed:
        evidence = (
            f"the drill changed files of the run outside its scratch copy: "
            f"{', '.join(changed[:5])}; a drill must not write outputs or linked files "
            f"(skip such writes when ACCEPTRUN_DRILL is set). {result.evidence}"
        )
        result = DrillResult(False, info.step, evidence, seconds, log_dir)
        record.event(
            "drill", sync=True, drill="restore", ok=False, step=info.step, evidence=evidence
        )
    record.write_json(
        f"drills/{n}/result.json",
        {"drill": "restore", "ok": result.ok, "step": info.step, "checkpoint": str(info.path),
         "cpu": cpu, "evidence": result.evidence, "seconds": round(seconds, 3), "at": now_iso()},
    )  # fmt: skip
    return result


# ---- a black box's own checkpoints (checkpoint.watch) ------------------------------------------


def _is_watched(record: RunRecord, spec: RunSpec, info: CheckpointInfo) -> bool:
    """A captured checkpoint of a command that is not a client workload."""
    from acceptrun.workload.usage import CLIENT

    return bool(sources_of(info)) and _usage_kind(record, spec) != CLIENT


def _watched_plan(record: RunRecord, spec: RunSpec, info: CheckpointInfo) -> dict[str, str]:
    """Stored name -> path relative to the workdir, where the drill puts each file back.

    Raises :class:`UserError` (before anything runs) when the drill could not prove a
    resume: no progress source, no resume arguments, a file or TensorBoard directory
    outside the working directory (the drill would write the user's own).
    """
    ck, prog = spec.checkpoint, spec.progress
    what = f"run {record.run_id} is a black box (its script does not use the client API)"
    if prog.pattern is None and prog.tensorboard is None:
        raise UserError(
            f"{what} and its spec reads no progress from it: the drill could not tell a "
            "script that resumed from one that trains from scratch, so nothing was run. Add "
            r'progress.pattern (a regex over its step lines, e.g. "iter (?P<step>\d+): '
            r'loss (?P<loss>[0-9.eE+-]+)") or progress.tensorboard to the spec, then drill '
            "a run of it"
        )
    if not ck.resume_args:
        raise UserError(
            f"{what} and checkpoint.resume_args is empty: the drill would start it without "
            "telling it to resume, so it would train from scratch. Set checkpoint.resume_args "
            '(e.g. ["--init_from=resume"] or ["--resume", "{checkpoint}"]) in the spec'
        )
    workdir = spec.workdir_path
    if prog.tensorboard is not None and not inside(workdir, workdir / prog.tensorboard):
        raise UserError(
            f"progress.tensorboard = {prog.tensorboard!r} is outside the working directory "
            f"{workdir}: the drill runs in a scratch copy of the working directory and would "
            "read (and the script write) the run's own event files; use a path inside it"
        )
    rel_meta = info.meta.get("watched_relative") or {}
    plan: dict[str, str] = {}
    for name, entry in sources_of(info).items():
        rel = rel_meta.get(name) if isinstance(rel_meta, dict) else None
        if rel is None:
            source = Path(str(entry.get("path")))
            if not inside(workdir, source):
                raise UserError(
                    f"checkpoint step {info.step} of run {record.run_id} was captured from "
                    f"{source}, outside the working directory {workdir}: the drill restores "
                    "into a scratch copy of the working directory and will not write over "
                    f"{source}. Watch checkpoint files under the working directory (e.g. "
                    'checkpoint.watch = ["out/ckpt.pt"], with the script saving there)'
                )
            rel = source.resolve().relative_to(workdir).as_posix()
        plan[name] = str(rel)
    return plan


def _watched_drill(
    spec: RunSpec,
    info: CheckpointInfo,
    plan: dict[str, str],
    env: dict[str, str],
    scratch: Path,
    log_dir: Path,
    *,
    timeout: float,
    echo: bool,
) -> tuple[bool, str]:
    """Put the checkpoint back into ``scratch``, resume the command there, watch its steps.

    Passes once a step after the checkpoint's is seen; returns (ok, evidence).
    """
    from acceptrun.supervisor.external import PLACEHOLDER, with_resume_args
    from acceptrun.supervisor.progress import ProgressReader
    from acceptrun.workload.distributed import launch_command

    try:
        placed = put_back(info, {name: scratch / rel for name, rel in plan.items()})
    except (AcceptrunError, OSError) as exc:
        return False, f"step {info.step} could not be put back into the scratch copy: {exc}"
    restored = next(iter(placed.values()))
    rel_restored = restored.relative_to(scratch).as_posix()
    args = shlex.join(a.replace(PLACEHOLDER, rel_restored) for a in spec.checkpoint.resume_args)
    command = with_resume_args(launch_command(spec, env), spec, str(restored))
    head = (
        f"restored step {info.step} ({', '.join(sorted(plan.values()))}) into a scratch copy "
        f"and started the command with {args}"
    )
    # The drill's own step events go to drills/<n>/events.jsonl, never to the run's.
    sink = RunRecord(log_dir)
    reader = ProgressReader(
        sink, spec, 0, log_dir / "stdout.log", log_dir / "stderr.log", workdir=scratch
    )
    child = ChildProcess(
        command, cwd=scratch, env=env, stdout_path=log_dir / "stdout.log",
        stderr_path=log_dir / "stderr.log", echo=echo,
    )  # fmt: skip
    try:
        child.start()
    except OSError as exc:
        return False, f"{head}; it could not start: {exc.strerror or exc}"
    rc, first, after, diverged = _watch_steps(child, reader, sink, info.step, timeout)
    if rc is None:  # proved, disproved or timed out: stop it (SIGTERM, grace, SIGKILL)
        child.signal_group(signal.SIGTERM)
        if child.wait(STOP_GRACE_S) is None:
            child.signal_group(signal.SIGKILL)
            child.wait(10)
        child.finish()
    saw = "no step" if first is None else f"first step {first[0]} after {first[1]:.1f}s"
    if first is not None and first[0] < info.step:
        how = "it trained from scratch" if first[0] <= 0 else "before the checkpoint's step"
        return False, (
            f"{head}, but the first step it showed was {first[0]} ({how}): the resume did not "
            f"take; {args} must make the script load {rel_restored} and continue from it"
        )
    if diverged is not None:
        return False, f"{head}; its loss diverged after the restore: {diverged.get('reason')}"
    if rc is not None and rc != 0:
        return False, f"{head}; it exited {rc} ({_last_line(log_dir)}); {saw}"
    if after is None and rc == 0:
        return False, (
            f"{head}; it exited 0 without a step after step {info.step} ({saw}): nothing was "
            "left to train from this checkpoint, or its step lines do not match "
            "progress.pattern"
        )
    if after is None:
        return False, (
            f"{head}; no step after step {info.step} within {timeout:g}s ({saw}); raise "
            "--timeout if its start-up takes longer"
        )
    took = f"step {after[0]} after {after[1]:.1f}s"
    shown = took if first is not None and first[0] == after[0] else f"{saw}, {took}"
    return True, f"{head}: {shown}, after the checkpoint's step (resumed, not from scratch)"


_Seen = tuple[int, float]  # a step and the seconds from the drill's start to it


def _watch_steps(
    child: ChildProcess, reader: ProgressReader, sink: RunRecord, ckpt_step: int, timeout: float
) -> tuple[int | None, _Seen | None, _Seen | None, dict[str, Any] | None]:
    """Read the resumed command's progress until it proves or disproves the resume.

    Returns (exit status or None while it runs, its first step, its first step after
    ``ckpt_step``, the divergence it showed) once a first step before the checkpoint's,
    a step after it, a divergence, an exit or ``timeout`` comes.
    """
    t0 = time.monotonic()
    first: _Seen | None = None
    after: _Seen | None = None
    diverged: dict[str, Any] | None = None
    seen = 0
    while True:
        rc = child.wait(POLL_S)
        if rc is not None:
            child.finish()  # its last lines drained into the logs before the last read
        diverged = reader.poll(final=rc is not None) or diverged
        elapsed = time.monotonic() - t0
        steps = [int(e["step"]) for e in sink.events("step")]
        for step in steps[seen:]:
            first = first or (step, elapsed)
            if after is None and step > ckpt_step:
                after = (step, elapsed)
        seen = len(steps)
        if (first is not None and first[0] < ckpt_step) or after is not None:
            break
        if diverged is not None or rc is not None or elapsed >= timeout:
            break
    return rc, first, after, diverged


def _last_line(log_dir: Path) -> str:
    """The last line of the drill's stderr (else stdout): evidence of why it exited."""
    for name in ("stderr.log", "stdout.log"):
        path = log_dir / name
        if path.exists():
            tail = path.read_bytes()[-TAIL_BYTES:].decode(errors="replace").strip()
            if tail:
                return tail.splitlines()[-1]
    return "no output"


def _scratch_copy(src: Path, dest: Path, skip: set[Path]) -> list[Path]:
    """Copy the working directory ``src`` to ``dest`` for a drill; returns what was linked.

    Small files are copied (a write in the drill lands in the copy); big files, files
    past the copy budget and environments are symlinked (returned, to be watched);
    ``skip`` (the workspace, the checkpoint directory) and ``_SKIP_DIRS`` are left out.
    """
    linked: list[Path] = []
    budget = COPY_BUDGET_BYTES
    dest.mkdir(parents=True)
    for root, dirs, files in os.walk(src):
        here = Path(root)
        out = dest / here.relative_to(src)
        for name in list(dirs):
            path = here / name
            if name in _SKIP_DIRS or path.resolve() in skip:
                dirs.remove(name)
            elif name in _LINK_DIRS or path.is_symlink():
                (out / name).symlink_to(_link_target(path, src, dest))
                dirs.remove(name)
            else:
                (out / name).mkdir()
        for name in files:
            path = here / name
            if path.is_symlink():
                (out / name).symlink_to(_link_target(path, src, dest))
                continue
            size = path.stat().st_size
            if size <= COPY_FILE_BYTES and size <= budget:
                shutil.copy2(path, out / name)
                budget -= size
            else:
                (out / name).symlink_to(path)
                linked.append(path)
    return linked


def _link_target(path: Path, src: Path, dest: Path) -> Path:
    """Where the copy of ``path`` links: into the copy for a symlink within ``src``, else out."""
    if not path.is_symlink():
        return path  # an environment directory, linked whole
    target = path.resolve()
    if target.is_relative_to(src.resolve()):
        return dest / target.relative_to(src.resolve())
    return target


def _output_paths(record: RunRecord) -> list[Path]:
    """The files the run registered as outputs (the newest path of each name)."""
    paths: dict[str, Path] = {}
    for ev in record.events("output"):
        if isinstance(ev.get("path"), str):
            paths[str(ev.get("name"))] = Path(ev["path"])
    return list(paths.values())


def _stat(path: Path) -> tuple[int, int, int] | None:
    """What a write changes: size, modification time (ns), inode; None if absent."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)
