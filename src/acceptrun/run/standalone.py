"""The run a script starts: attach to the supervisor's, or create and close a standalone one.

:func:`init` (``acceptrun.init``) returns the :class:`~acceptrun.workload.run.Run` of the
process. Under ``acceptrun run`` it attaches to the record the supervisor passes in the
environment. Started as a plain ``python train.py`` it creates a standalone run in the
nearest workspace (spec from argv, provenance now) and hands the run a closer: when the
run finishes, :func:`~acceptrun.run.close.close_standalone` writes its verdict and report,
which are imported only then. A standalone run, recorded in a workspace of its own:

>>> import tempfile
>>> run = init("doc-example", workspace=tempfile.mkdtemp())
>>> start = run.restore(epoch=0)                      # plain values are state too
>>> for step in run.steps(start, 3):
...     with run.data_wait():
...         batch = [step, step + 1]
...     run.log(step, loss=1.0 / (step + 1), samples=len(batch))
>>> run.metric("eval/accuracy", 0.75)
>>> run.finish()
>>> [e["step"] for e in run.record.events("step")]
[0, 1, 2]
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from acceptrun.errors import AcceptrunRuntimeError
from acceptrun.record.lease import end_lease, start_lease
from acceptrun.record.workspace import RunRecord, find_workspace, now_iso
from acceptrun.workload import standby
from acceptrun.workload.contract import ENV_ATTEMPT, ENV_RUN_DIR
from acceptrun.workload.run import Run

__all__ = ["init"]

_active: Run | None = None


def init(name: str | None = None, *, workspace: str | os.PathLike[str] | None = None) -> Run:
    """Attach to the supervisor's run, or create a standalone run when there is none.

    Calling it twice returns the same :class:`Run`. ``name`` and ``workspace`` apply to
    standalone runs only (default name: the script's file name).

    ::

        run = acceptrun.init()
    """
    global _active
    if _active is not None and not _active.finished:
        return _active
    run_dir = os.environ.get(ENV_RUN_DIR)
    world = os.environ.get("WORLD_SIZE")
    if not run_dir and world not in (None, "", "1"):
        raise AcceptrunRuntimeError(
            f"WORLD_SIZE={world}: a run of several processes is recorded by the supervisor; "
            "start it with `acceptrun run spec.toml` and resources.processes in the spec, "
            "not with torchrun directly"
        )
    if run_dir:
        record = RunRecord(run_dir)
        if not record.exists("run.json"):
            raise AcceptrunRuntimeError(f"${ENV_RUN_DIR} is {run_dir!r}, which is not a run record")
        run = Run(record, attempt=int(os.environ.get(ENV_ATTEMPT, "1")), supervised=True)
    else:
        record = _create_standalone(name, workspace)
        run = Run(record, attempt=1, supervised=False, on_finish=_closer(record))
    # Loading the frozen spec teaches this process its secrets (spec/load.py learns them):
    # a mirror or data URL's password the workload quotes, in an exception say, is then
    # hidden in every event it writes, as it is in the supervisor's.
    _ = run.spec  # the property loads (and caches) it
    # A standby attempt (limits.warm_restart) attaches once the supervisor says go, in
    # run.restore() or run.steps() (workload/standby.py); any other process now.
    if not (run.supervised and standby.hold(run, lambda: _attach(run))):
        _attach(run)
    _active = run
    return run


def _attach(run: Run) -> None:
    """The run's start in the record, its exit hooks, SIGTERM handler and watch aids."""
    if run.rank == 0:
        size: dict[str, Any] = {"world_size": run.world_size} if run.ranks.distributed else {}
        run.record.event(
            "workload_start", attempt=run.attempt, pid=os.getpid(), resume_from=run.resume_from,
            **size,
        )  # fmt: skip
    atexit.register(run._at_exit)
    _before_interpreter_shutdown(run._before_shutdown)
    previous = sys.excepthook
    if previous is sys.__excepthook__:
        sys.excepthook = run._excepthook
    if threading.current_thread() is threading.main_thread() and run.supervised:
        signal.signal(signal.SIGTERM, run._on_stop_signal)
    if run.supervised and run.ranks.distributed:
        from acceptrun.workload.distributed import die_with_parent

        die_with_parent()  # a rank must not outlive the torchrun agent the supervisor kills
    if run.supervised and not run.drill:
        run._start_watch_aids()


def _create_standalone(name: str | None, workspace: str | os.PathLike[str] | None) -> RunRecord:
    """A run record for a plain ``python train.py``: spec from argv, provenance now."""
    from acceptrun.capture import provenance
    from acceptrun.spec.model import RunSpec

    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "python"
    command = [sys.executable, *sys.argv]
    spec = RunSpec(name=name or script, command=command, workdir=os.getcwd())
    spec.source = "standalone: " + " ".join(command)
    ws = find_workspace(None if workspace is None else Path(workspace), create=True)
    record = ws.create_run(
        spec.name,
        spec_text=spec.to_toml(secrets=False),
        state={"mode": "standalone", "status": "running", "started_at": now_iso(), "attempts": 1},
    )
    # This process keeps the record: if it dies without closing it (kill -9, the OOM
    # killer), readers show the run interrupted, not running for ever (record/lease.py).
    start_lease(record, role="standalone")
    prov = provenance.capture(diff_path=record.file("git.diff"), exclude=[ws.root])
    record.write_json("provenance.json", prov)
    return record


def _closer(record: RunRecord) -> Callable[[str], None]:
    """What a standalone run does when it finishes: close its record, then let go of it."""

    def close(status: str) -> None:
        from acceptrun.run.close import close_standalone

        close_standalone(record, status=status)
        end_lease(record)  # closed: this process lets go of its record

    return close


def _before_interpreter_shutdown(hook: Callable[[], None]) -> None:
    """Call ``hook`` when the interpreter starts to exit, while thread pools still take work.

    threading runs its exit hooks (``threading._register_atexit``, in reverse order) before
    it joins threads and before atexit's handlers; concurrent.futures registers one that
    stops every pool. Importing concurrent.futures.thread first puts that one earlier, so
    ``hook`` runs before it. Where the hook cannot be registered (another Python, or the
    interpreter already exiting), :meth:`Run.finish` closes the checkpoints at atexit.
    """
    import concurrent.futures.thread  # noqa: F401  (registers its own exit hook now)

    register = getattr(threading, "_register_atexit", None)
    if register is None:
        return
    with contextlib.suppress(RuntimeError):  # "can't register atexit after shutdown"
        register(hook)
