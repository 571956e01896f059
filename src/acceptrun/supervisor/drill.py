"""The restore drill: prove that the latest checkpoint restores, in a fresh process.

``acceptrun ckpt drill RUN`` starts the run's own command again, in a new process, with
``ACCEPTRUN_RESUME_FROM`` set to the newest checkpoint that verifies and
``ACCEPTRUN_DRILL=restore``. The workload builds its model as it always does; the client
API restores the checkpoint in ``run.restore(...)``, lets ``run.steps()`` run exactly
one step, records a ``drill`` event with what it saw, and exits without saving or
logging anything into the run. ``--cpu`` hides the GPUs (``CUDA_VISIBLE_DEVICES=""``)
to prove the checkpoint restores on another kind of machine.

The drill never changes the user's files: it runs in a scratch copy of the working
directory (``drills/<n>/workdir``, removed afterwards), so a script that truncates its
log, writes its model or saves outputs at start-up or in its one step writes into the
copy. Files too big to copy (over ``COPY_FILE_BYTES``, or past ``COPY_BUDGET_BYTES`` in
all) and virtual environments are symlinked instead: each such file, and every
registered output, is checked (size, mtime, inode) before and after, and a drill that
changed one fails, naming it.

The drill's result is an event in the run's events.jsonl, which the verdict reads.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.client import ENV_DRILL
from acceptrun.errors import UserError
from acceptrun.spec import RunSpec, load_spec
from acceptrun.supervisor.core import contract_env
from acceptrun.supervisor.process import ChildProcess
from acceptrun.workspace import RunRecord, now_iso, user_at_host

__all__ = ["DrillResult", "restore_drill"]

TAIL_BYTES = 2000  # of stderr kept as evidence when a drill fails
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


def _refuse_black_box(record: RunRecord, spec: RunSpec) -> None:
    """A script without the client and without watched checkpoints has nothing to restore."""
    from acceptrun.usage import BLACK_BOX, detect_usage

    usage = next(iter(record.events("usage")), None)
    kind = usage.get("usage") if usage is not None else detect_usage(spec).kind
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
    ckpt_dir = (
        Path(spec.resolve_path(spec.checkpoint.dir))
        if spec.checkpoint.dir
        else record.checkpoints_dir
    )
    store = CheckpointStore(ckpt_dir)
    info = store.latest_verified(quarantine=False)
    if info is None:
        raise UserError(
            f"run {record.run_id} has no checkpoint that verifies in {ckpt_dir}; "
            "a restore drill needs one (see `acceptrun ckpt ls`)"
        )
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
        "drill_start", sync=True, drill="restore", step=info.step, cpu=cpu, by=user_at_host()
    )
    before = sum(1 for _ in record.events("drill"))
    # The run's own launch: through torchrun with resources.processes > 1, since a
    # checkpoint restores only with the number of processes that saved it.
    from acceptrun.distributed import launch_command

    scratch = log_dir / "workdir"
    skip = {record.path.parent.parent.resolve(), ckpt_dir.resolve()}  # workspace, checkpoints
    linked = _scratch_copy(spec.workdir_path, scratch, skip)
    watched = _output_paths(record) + linked
    before_stat = {p: _stat(p) for p in watched}
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
    seconds = time.monotonic() - t0
    changed = [str(p) for p in watched if _stat(p) != before_stat[p]]
    reported = list(record.events("drill"))[before:]
    if reported:
        # One drill event per rank in a multi-process run (rank 0's tells the story).
        last = next((e for e in reported if e.get("rank", 0) == 0), reported[-1])
        ok = all(bool(e.get("ok")) for e in reported) and rc == 0
        ranks = f" on {len(reported)} ranks" if len(reported) > 1 else ""
        evidence = (
            f"{last.get('evidence')}{ranks}{' with GPUs hidden' if cpu else ''}; "
            f"{seconds:.1f}s in all"
        )
        if not ok and rc != 0:
            evidence += f"; exit {rc}"
        result = DrillResult(ok, info.step, evidence, seconds, log_dir)
    else:
        tail = (log_dir / "stderr.log").read_bytes()[-TAIL_BYTES:].decode(errors="replace").strip()
        last_line = tail.splitlines()[-1] if tail else "no output"
        why = "timed out" if seconds >= timeout else f"exited {rc}"
        evidence = (
            f"the workload {why} without reporting a drill ({last_line}); it must call "
            "run.restore(...) and loop with run.steps(...)"
        )
        result = DrillResult(False, info.step, evidence, seconds, log_dir)
        record.event(
            "drill", sync=True, drill="restore", ok=False, step=info.step, evidence=evidence
        )
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
