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
``events.jsonl``. Started as a plain ``python train.py`` the run is a standalone one
(:mod:`acceptrun.run.standalone` creates its record and closes it when it finishes), so
the same script is recorded either way. Nothing here imports torch until the first
checkpoint is saved or restored.

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

import os
import shutil
from pathlib import Path
from typing import Any

from acceptrun._util.durable import write_atomic
from acceptrun._util.hashing import hash_file
from acceptrun._util.redact import redact_text
from acceptrun.errors import AcceptrunFileNotFoundError, AcceptrunValueError
from acceptrun.workload.base import _number
from acceptrun.workload.checkpointing import Checkpointing
from acceptrun.workload.loop import StepLoop
from acceptrun.workload.signals import StopHandling
from acceptrun.workload.watch import WorkloadWatch

__all__ = ["Run"]


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
        if self.on_finish is not None:
            self.on_finish(status)  # a standalone run closes its record (run/standalone.py)

    def __repr__(self) -> str:
        mode = "supervised" if self.supervised else "standalone"
        return f"<Run {self.run_id} attempt={self.attempt} {mode}>"
