"""The in-workload API: a few lines in a training loop.

::

    import acceptrun

    run = acceptrun.init()
    start = run.restore(model=model, optimizer=opt, scheduler=sched)   # 0 on a fresh start
    for step in run.steps(start, total_steps):
        with run.data_wait():
            batch = next(batches)
        loss = train_step(batch)
        run.log(step, loss=loss.item(), samples=len(batch))
        run.maybe_checkpoint(step)              # interval from the spec; async
    run.metric("eval/accuracy", accuracy)
    run.output("model", "out/model.safetensors")
    run.finish()

Under ``acceptrun run`` the supervisor passes the run directory in the environment (see
:data:`~acceptrun.workload.contract.ENV_VARS`) and this module appends events to its
``events.jsonl``. Started as a plain ``python train.py`` it creates a standalone run in
the nearest workspace, so the same script is recorded either way; the verdict and the
report of a standalone run are imported only when it finishes. Nothing here imports torch
until the first checkpoint is saved or restored. A standalone run, recorded in a
workspace of its own:

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

In a run of several processes (``resources.processes``, started through torchrun) every
rank calls the same API. Rank 0 records the run: step, metric, output and lifecycle
events, heartbeats. The other ranks write only what is theirs to tell (``diverged``,
``stopped``, a failed save, an error at exit), with their ``rank``. A stop request is
agreed by all ranks at each step boundary (one all_reduce of one number on a gloo group
of acceptrun's own, ~0.15 ms), so they all checkpoint the same step and exit together.
Checkpoints are gathered: rank 0 writes the replicated state (model, optimizer, ...),
every rank writes its own (RNG states and what ``restore(per_rank=...)`` names, such as
its data loader) into ``rank-<r>/`` of the same step directory, and rank 0 commits once
all have written.

The :class:`Run` is made of parts, one concern each: :mod:`~acceptrun.workload.loop`,
:mod:`~acceptrun.workload.signals`, :mod:`~acceptrun.workload.checkpointing` and
:mod:`~acceptrun.workload.watch`, over the shared state of :mod:`~acceptrun.workload.base`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from acceptrun._util.durable import write_atomic
from acceptrun._util.hashing import hash_file
from acceptrun._util.redact import redact_text
from acceptrun.errors import AcceptrunFileNotFoundError, AcceptrunRuntimeError, AcceptrunValueError
from acceptrun.record.lease import end_lease, start_lease
from acceptrun.record.workspace import RunRecord, find_workspace, now_iso
from acceptrun.workload.base import _number
from acceptrun.workload.checkpointing import Checkpointing
from acceptrun.workload.contract import ENV_ATTEMPT, ENV_RUN_DIR
from acceptrun.workload.loop import StepLoop
from acceptrun.workload.signals import StopHandling
from acceptrun.workload.watch import WorkloadWatch

__all__ = ["Run", "init"]

_active: Run | None = None


class Run(StepLoop, StopHandling, Checkpointing, WorkloadWatch):
    """A handle on the current run. Create it with :func:`acceptrun.init`."""

    # ---- batch inference ------------------------------------------------------------------------

    @property
    def inference(self) -> Any:
        """The batch side of a run with an ``[inference]`` section (inference.BatchJob).

        ::

            for shard in run.inference.shards():
                shard.commit([model(x) for x in shard.values])
        """
        if self._batch is None:
            from acceptrun.workload.batch import BatchJob

            self._batch = BatchJob(self, self.spec.inference)
        return self._batch

    # ---- results ------------------------------------------------------------------------------

    def metric(
        self,
        name: str,
        value: float,
        *,
        step: int | None = None,
        per_attempt: str | None = None,
        instead: str | None = None,
    ) -> None:
        """Record a final (or evaluation) metric; acceptance thresholds read the last value.

        ``per_attempt`` says why the value is a figure of this attempt only (a framework's
        average that a resume does not carry over, workload/aggregates.py), ``instead``
        what to judge the run by: the verdict refuses such a metric as an acceptance one.
        """
        if not name:
            raise AcceptrunValueError("metric name is empty; use a name such as 'eval/accuracy'")
        if self.drill or self.rank != 0:
            return
        fields: dict[str, Any] = {"attempt": self.attempt, "name": name, "value": _number(value)}
        if step is not None:
            fields["step"] = step
        if per_attempt:
            fields["per_attempt"] = per_attempt
            if instead:
                fields["instead"] = instead
        self.record.event("metric", **fields)

    def output(
        self, name: str, path: str | os.PathLike[str], *, copy: bool = False
    ) -> dict[str, Any]:
        """Register a file as an output of the run, with its size and content hash.

        ``copy=True`` also copies it into the record's ``outputs/<name>/``; by default
        the record keeps a reference (large models stay where they are). In a
        multi-process run only rank 0 registers (the others return ``{}`` at once).
        """
        src = Path(path).resolve()
        if self.drill or self.rank != 0:
            return {}
        if not src.is_file():
            raise AcceptrunFileNotFoundError(
                f"output {name!r}: {src} is not a file; write it before run.output()"
            )
        digest, size = hash_file(src)
        stored = str(src)
        if copy:
            dest_dir = self.record.outputs_dir / name
            dest_dir.mkdir(parents=True, exist_ok=True)
            dest = dest_dir / src.name

            def write(f: Any) -> None:
                with open(src, "rb") as source:
                    shutil.copyfileobj(source, f, 4 * 1024 * 1024)

            write_atomic(dest, write)
            stored = str(dest)
        return self.record.event(
            "output",
            sync=True,
            attempt=self.attempt,
            name=name,
            path=stored,
            hash=digest,
            size=size,
        )

    def finish(self, status: str = "ok") -> None:
        """Mark the end of the workload. Called automatically at interpreter exit."""
        if self.finished:
            return
        self.finished = True
        failed = self._close_checkpoints_once()  # done already at the exit hook, or now
        if failed is not None and status == "ok":
            status = failed
        if self.drill:
            return
        if self.rank != 0 and not status.startswith("error"):
            return  # rank 0 reports the end; another rank only its own error
        status = redact_text(status)  # an exception's text may quote a token or a password
        self.record.event(
            "workload_end", sync=True, attempt=self.attempt, status=status, **self._rank_field()
        )
        if not self.supervised:
            from acceptrun.run.close import close_standalone

            close_standalone(self.record, status=status)
            end_lease(self.record)  # closed: this process lets go of its record

    def __repr__(self) -> str:
        mode = "supervised" if self.supervised else "standalone"
        return f"<Run {self.run_id} attempt={self.attempt} {mode}>"


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
        run = Run(_create_standalone(name, workspace), attempt=1, supervised=False)
    # Loading the frozen spec teaches this process its secrets (spec/load.py learns them):
    # a mirror or data URL's password the workload quotes, in an exception say, is then
    # hidden in every event it writes, as it is in the supervisor's.
    _ = run.spec  # the property loads (and caches) it
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
    _active = run
    return run


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
