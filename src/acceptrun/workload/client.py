"""The in-workload API: a few lines in a training loop.

::

    import acceptrun

    run = acceptrun.init()
    start = run.restore(model=model, optimizer=opt, scheduler=sched)   # 0 on a fresh start
    for step in run.steps(total_steps, start=start):
        with run.data_wait():
            batch = next(batches)
        loss = train_step(batch)
        run.log(step, loss=loss.item(), samples=len(batch))
        run.maybe_checkpoint(step)              # interval from the spec; async
    run.metric("eval/accuracy", accuracy)
    run.output("model", "out/model.safetensors")
    run.finish()

Under ``acceptrun run`` the supervisor passes the run directory in the environment (see
:data:`ENV_VARS`) and this module appends events to its ``events.jsonl``. Started as a
plain ``python train.py`` it creates a standalone run in the nearest workspace, so the
same script is recorded either way. Nothing here imports torch until the first
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
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import shutil
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from acceptrun._util.durable import write_atomic
from acceptrun._util.hashing import hash_file
from acceptrun.record.workspace import RunRecord, find_workspace, now_iso

__all__ = ["ENV_VARS", "Run", "init"]

# The workload contract: environment variables the supervisor sets for every attempt.
ENV_RUN_DIR = "ACCEPTRUN_RUN_DIR"
ENV_RUN_ID = "ACCEPTRUN_RUN_ID"
ENV_ATTEMPT = "ACCEPTRUN_ATTEMPT"
ENV_RESUME_FROM = "ACCEPTRUN_RESUME_FROM"
ENV_CHECKPOINT_DIR = "ACCEPTRUN_CHECKPOINT_DIR"
ENV_SPEC = "ACCEPTRUN_SPEC"
ENV_DRILL = "ACCEPTRUN_DRILL"
ENV_INJECT = "ACCEPTRUN_INJECT"
ENV_HEARTBEAT_S = "ACCEPTRUN_HEARTBEAT_S"
ENV_MAX_STEPS = "ACCEPTRUN_MAX_STEPS"
ENV_INJECT_RANK = "ACCEPTRUN_INJECT_RANK"
HEARTBEAT_S = 10.0  # seconds between heartbeats: what hang and data-stall detection read
EXIT_DIVERGED = 3  # exit status after a "diverged" event (the event, not the code, decides)
ENV_VARS = {
    ENV_RUN_DIR: "absolute path of the run record directory",
    ENV_RUN_ID: "the run id",
    ENV_ATTEMPT: "attempt number, 1 for the first launch",
    ENV_RESUME_FROM: "checkpoint directory to resume from; empty on a fresh start",
    ENV_CHECKPOINT_DIR: "directory where the workload's checkpoints go",
    ENV_SPEC: "path of the frozen spec (spec.toml in the run record)",
    ENV_DRILL: "set by `acceptrun ckpt drill`: restore, run one step, record the result, exit",
    ENV_INJECT: "faults to inject for drills, e.g. kill@step=40 (acceptrun run --inject)",
    ENV_HEARTBEAT_S: f"seconds between heartbeat events (default {HEARTBEAT_S:g})",
    ENV_MAX_STEPS: "run.steps() yields at most this many steps (set by `acceptrun scaling`)",
    ENV_INJECT_RANK: "the rank that fires injected step faults in a multi-process run (default 0)",
}

_active: Run | None = None


class Run:
    """A handle on the current run. Create it with :func:`acceptrun.init`."""

    def __init__(self, record: RunRecord, *, attempt: int, supervised: bool) -> None:
        self.record = record
        self.run_id = record.run_id
        self.run_dir = record.path
        self.attempt = attempt
        self.supervised = supervised
        self.resume_from: str | None = os.environ.get(ENV_RESUME_FROM) or None
        self.checkpoint_dir = Path(os.environ.get(ENV_CHECKPOINT_DIR) or record.checkpoints_dir)
        self.finished = False
        self._pid = os.getpid()  # a forked child (a data-loader worker) has another
        self._stop_requested = False
        self._in_steps = False
        self._pending: dict[str, Any] = {}
        self._data_wait = 0.0  # seconds waited for data in the current step
        self._last_log: float | None = None
        self._exception: BaseException | None = None
        self.drill = os.environ.get(ENV_DRILL) or None
        self._objects: dict[str, Any] = {}
        self._checkpointer: Any = None  # checkpoint.saver.Checkpointer, created on first use
        self._last_values: dict[str, float] = {}
        self._last_values_step: int | None = None  # the step _last_values were logged for
        self._last_saved_step: int | None = None
        self._last_save_time = time.monotonic()
        self._restored: dict[str, Any] | None = None
        self._values: dict[str, Any] = {}  # plain values the last restore gave back
        self._spec: Any = None
        # What the loop is doing, for the heartbeat thread: (phase, step, since unix s).
        self._phase: tuple[str, int | None, float] = ("startup", None, time.time())
        self._faults: list[Any] = []
        self._stacks_file: Any = None
        # Multi-process runs (torchrun): this process's rank, acceptrun's own collectives
        # (created on first use), and the state each rank saves for itself.
        from acceptrun.workload.distributed import rank_info

        self.ranks = rank_info()
        self.rank = self.ranks.rank
        self.world_size = self.ranks.world_size
        self._group: Any = None  # distributed.RankGroup
        self._per_rank: dict[str, Any] = {}
        self._stop_signal = False  # this rank got SIGTERM; _stop_requested: all ranks agreed
        self._stopping = False
        self._total_steps: int | None = None  # the end of the current steps() loop
        self._loop_stops = False  # handle_stops(): a framework's loop polls stop_requested
        self._batch: Any = None  # inference.BatchJob, created by the first run.inference

    # ---- the training loop ----------------------------------------------------------------

    def steps(self, start_or_total: int, total: int | None = None) -> Iterator[int]:
        """Yield step numbers like ``range``: ``steps(100)`` is 0..99, ``steps(40, 100)`` 40..99.

        Each step is timed and its event (a heartbeat for the supervisor) written when
        the loop body finishes. A stop request (SIGTERM from the supervisor, a
        preemption) ends the loop at the next step boundary: the step in flight
        completes, the state after it is checkpointed when :meth:`restore` registered
        objects, and the process exits with status 143, as one killed by SIGTERM would.
        """
        start, total = (0, start_or_total) if total is None else (start_or_total, total)
        cap = os.environ.get(ENV_MAX_STEPS)
        if cap and not self.drill:  # a short measuring run (acceptrun scaling)
            total = min(total, start + int(cap))
        if self.drill and start >= total > 0:
            # A drill of a finished run restores its final checkpoint: still run one step.
            start = total - 1
        self._in_steps = True
        self._total_steps = total  # in each step event: `acceptrun top` shows step/total, ETA
        step = start
        try:
            while step < total:
                if self._stop_agreed():
                    self._stop_at(step)
                t0 = time.perf_counter()
                self._data_wait = 0.0
                self._phase = ("step", step, time.time())
                try:
                    yield step
                except GeneratorExit:
                    # `break` (or `return`) in the loop body: the step is done, keep its
                    # event. An exception in the body also closes this generator; that
                    # step did not complete and is not recorded.
                    if _closed_by_break():
                        self._end_step(step, time.perf_counter() - t0)
                    raise
                self._end_step(step, time.perf_counter() - t0)
                if self.drill:
                    self._finish_drill(step, time.perf_counter() - t0)
                step += 1
            if self.ranks.distributed and self._checkpointer is not None:
                # The last save's collectives run on acceptrun's own process groups, which
                # the script's destroy_process_group() after the loop would tear down.
                self._checkpointer.wait()
        finally:
            self._in_steps = False

    def _stop_agreed(self) -> bool:
        """Whether to stop at this step boundary; in a multi-process run, every rank's answer.

        Ranks get the SIGTERM (forwarded by torchrun's agent) at different steps; each
        boundary they agree (a collective of one number) so that all stop at the same one.
        """
        if self.ranks.distributed and (group := self._rank_group()) is not None:
            self._stop_requested = group.agree(self._stop_signal)
        return self._stop_requested

    def _stop_at(self, step: int) -> None:
        """A stop request at a step boundary: checkpoint what is done, then exit 143."""
        self._in_steps = False
        self._stopping = True
        saved = None
        registered = self._objects or self._per_rank
        if registered and step > 0 and self._last_saved_step != step - 1:
            self.checkpoint(step - 1, block=True)
            saved = step - 1
        elif self._checkpointer is not None:
            self._checkpointer.wait()
            saved = self._last_saved_step
        self.record.event(
            "stopped",
            sync=True,
            attempt=self.attempt,
            step=step,
            checkpoint=saved,
            reason="stop requested",
            **self._rank_field(),
        )
        if self._group is not None:
            # Exit together: torchrun's agent takes a rank that exits first for a failure
            # and would tear the others down in the middle of their exit.
            self._group.barrier()
        raise SystemExit(143)

    def _rank_field(self) -> dict[str, Any]:
        """``{"rank": r}`` in a multi-process run; nothing otherwise (same events as before)."""
        return {"rank": self.rank} if self.ranks.distributed else {}

    def _rank_group(self) -> Any:
        """acceptrun's collectives (distributed.RankGroup), once torch.distributed is up.

        Created by every rank at the same point of the script (its first restore, step
        boundary or checkpoint after init_process_group); None before that.
        """
        if self._group is None and self.ranks.distributed:
            from acceptrun.workload.distributed import RankGroup, torch_distributed_ready

            if torch_distributed_ready():
                self._group = RankGroup(self.ranks)
        return self._group

    @contextlib.contextmanager
    def data_wait(self) -> Iterator[None]:
        """Time spent in this block counts as waiting for data (the data loader's stall)."""
        t0 = time.perf_counter()
        outer = self._phase
        self._phase = ("data_wait", outer[1], time.time())  # seen by the heartbeat thread
        try:
            yield
        finally:
            self._data_wait += time.perf_counter() - t0
            self._phase = outer

    def log(self, step: int, **values: float) -> None:
        """Record values for ``step`` (loss, samples, tokens, lr, ...).

        Inside :meth:`steps` the values join the step's event, written when the step
        ends. Outside it, each call writes a step event timed from the previous call.
        Cost: about 20 us per step; step events are held for at most 0.2 s and written
        together (:class:`~acceptrun._util.durable.AppendLog`). On a GPU, the ``.item()`` that
        produces a loss value is the expensive part (a device sync), not this call.
        """
        clean = {k: _number(v) for k, v in values.items()}
        if self._in_steps:
            self._pending.update(clean)
            return
        now = time.perf_counter()
        step_time = None if self._last_log is None else now - self._last_log
        self._last_log = now
        self._pending.update(clean)
        self._end_step(step, step_time)  # injected step faults fire in this loop too

    def _end_step(self, step: int, step_time: float | None) -> None:
        """The step is done: its faults (a NaN loss first), its event, then the others."""
        if self._faults:
            self._fire_faults(step, "before_emit")
        self._emit_step(step, step_time)
        if self._faults:
            self._fire_faults(step, "after_step")

    def _emit_step(self, step: int, step_time: float | None) -> None:
        self._last_values = {k: v for k, v in self._pending.items() if isinstance(v, int | float)}
        self._last_values_step = step
        if self.drill:
            return  # a drill proves the restore; its step is not part of the run
        event: dict[str, Any] = {"attempt": self.attempt, "step": step}
        if self._in_steps and self._total_steps is not None:
            event["total_steps"] = self._total_steps
        if step_time is not None:
            event["step_time"] = round(step_time, 6)
        if self._data_wait:
            event["data_wait"] = round(self._data_wait, 6)
        event.update(self._pending)
        self._pending = {}
        if self.rank == 0:  # one step event per step for the run, not one per rank
            self.record.event("step", defer=True, **event)  # written within 0.2 s
        loss = event.get("loss")
        if isinstance(loss, int | float) and self.supervised:
            self._check_divergence(step, float(loss))

    def _check_divergence(self, step: int, loss: float) -> None:
        """NaN/inf, or above ``limits.max_loss``: record it and exit, with no checkpoint.

        Saving here would make a diverged state the newest checkpoint, the one every
        restart and rollback would then start from.
        """
        limit = self.spec.limits.max_loss
        if math.isfinite(loss) and (limit is None or loss <= limit):
            return
        reason = f"loss {loss} at step {step}" + ("" if math.isfinite(loss) else " is not finite")
        if math.isfinite(loss):
            reason += f", above limits.max_loss = {limit:g}"
        self.record.event(
            "diverged", sync=True, attempt=self.attempt, step=step, loss=str(loss), reason=reason,
            **self._rank_field(),
        )  # fmt: skip
        self._in_steps = False
        raise SystemExit(EXIT_DIVERGED)

    @property
    def stop_requested(self) -> bool:
        """True once the supervisor (or a preemption) asked the workload to stop."""
        return self._stop_requested

    def handle_stops(self) -> None:
        """Take SIGTERM as a stop request outside :meth:`steps` too, for a loop run elsewhere.

        A framework's own loop (the Hugging Face Trainer, Lightning) calls this once, then
        polls :attr:`stop_requested` at its step boundaries, saves, and calls
        :meth:`exit_stopped`. Without it SIGTERM outside ``steps()`` keeps its default
        effect (the process dies at once).
        """
        self._loop_stops = True

    def exit_stopped(self, step: int, *, checkpoint: int | None) -> NoReturn:
        """Record a graceful stop after ``step`` (``checkpoint``: the step saved) and exit 143.

        For loops that poll :attr:`stop_requested` (see :meth:`handle_stops`); the state
        must already be saved. Raises ``SystemExit(143)``, the status of a process ended
        by SIGTERM, which the supervisor reads with the ``stopped`` event.
        """
        self._stopping = True
        self.record.event(
            "stopped", sync=True, attempt=self.attempt, step=step, checkpoint=checkpoint,
            reason="stop requested", **self._rank_field(),
        )  # fmt: skip
        raise SystemExit(143)

    # ---- batch inference ------------------------------------------------------------------------

    @property
    def inference(self) -> Any:
        """The batch side of a run with an ``[inference]`` section (inference.BatchJob).

        >>> for shard in run.inference.shards():
        ...     shard.commit([model(x) for x in shard.values])
        """
        if self._batch is None:
            from acceptrun.inference.batch import BatchJob

            self._batch = BatchJob(self, self.spec.inference)
        return self._batch

    # ---- checkpoints ----------------------------------------------------------------------------

    @property
    def spec(self) -> Any:
        """The frozen :class:`~acceptrun.spec.model.RunSpec` of this run (checkpoint intervals...)."""
        if self._spec is None:
            from acceptrun.spec.model import load_spec

            self._spec = load_spec(os.environ.get(ENV_SPEC) or self.record.spec_path)
        return self._spec

    def _store(self) -> Any:
        from acceptrun.checkpoint.store import CheckpointStore

        ck = self.spec.checkpoint
        best = tuple(ck.keep_best.rsplit(":", 1)) if ck.keep_best else None
        return CheckpointStore(
            self.checkpoint_dir,
            keep_last=ck.keep_last,
            keep_every=ck.keep_every,
            keep_best=best,
            on_event=self._lifecycle_event,
        )

    def restore(
        self,
        *,
        map_location: str | None = None,
        per_rank: dict[str, Any] | None = None,
        **objects: Any,
    ) -> int:
        """Register what a checkpoint holds and restore it when resuming; returns the start step.

        ``objects`` are things with ``state_dict()``/``load_state_dict()`` (model,
        optimizer, scheduler, GradScaler, :class:`~acceptrun.checkpoint.ResumableLoader`)
        or plain values (dicts, lists, tensors, numpy arrays, numbers, strings, tuples).
        The RNG states (Python, NumPy, torch, CUDA) are always included. On a fresh
        start nothing is loaded and 0 is returned; when the supervisor resumes the run,
        the checkpoint is verified, loaded (tensors onto ``map_location``, default CPU,
        then each object copies to its own device) and the step after the checkpoint's
        is returned.

        Plain values come back too. Mutable ones in place, so the script's own
        references see them: a dict is cleared and updated, a list slice-assigned, a
        tensor (an RNN hidden state) or numpy array copied into under ``no_grad`` (same
        shape and dtype). Immutable ones (numbers, strings, tuples) cannot change in
        place: read them from :attr:`restored` (or :meth:`state`), and hand their new
        values to the next checkpoint with :meth:`update_state`. A value that cannot be
        restored (a tensor of another shape, a list where a dict was saved) raises
        :class:`~acceptrun.errors.UserError` naming it.

        In a multi-process run ``objects`` are the state every rank holds the same copy
        of (a DDP model, its optimizer): rank 0 saves them and every rank loads them.
        ``per_rank`` names the state that differs between ranks (its data loader or
        sampler position, its own generators): each rank saves and loads its own. With
        one process both are saved together, as before.

        >>> start = run.restore(model=model, optimizer=opt, scheduler=sched)
        >>> start = run.restore(model=ddp.module, optimizer=opt, per_rank={"loader": loader})
        >>> start = run.restore(model=model, history=history, best_loss=float("inf"))
        >>> best_loss = run.restored.get("best_loss", float("inf"))   # history: in place
        """
        both = sorted(set(objects) & set(per_rank or {}))
        if both:
            raise ValueError(f"{both}: a name is either shared (keyword) or in per_rank, not both")
        self._objects = dict(objects)
        self._per_rank = dict(per_rank or {})
        if self.ranks.distributed:
            self._rank_group()  # the collectives, while every rank is at the same point
        resume = self.resume_from
        if not resume:
            return 0
        from acceptrun.checkpoint.state import load_into, load_ranked, restore_values

        store = self._store()
        if self.ranks.distributed:
            path = self._agreed_resume_path(store, resume)
        else:
            path = self._verified_resume_path(store, resume)
        t0 = time.perf_counter()
        if self.ranks.distributed:
            loaded = load_ranked(
                path, self._objects, self._per_rank, rank=self.rank,
                world_size=self.world_size, device=map_location,
            )  # fmt: skip
        else:
            loaded = load_into(path, {**self._objects, **self._per_rank}, device=map_location)
        values = restore_values({**self._objects, **self._per_rank}, loaded["values"])
        for name, value in values.items():  # the next checkpoint saves the restored value
            (self._per_rank if name in self._per_rank else self._objects)[name] = value
        self._values = values
        manifest = store.get(int(path.name.split("-", 1)[1]))
        step = manifest.step if manifest is not None else int(path.name.split("-", 1)[1])
        self._restored = {"step": step, "path": str(path), "seconds": time.perf_counter() - t0}
        self._last_saved_step = step
        if not self.drill and self.rank == 0:
            self.record.event(
                "restored", sync=True, attempt=self.attempt, step=step, path=str(path),
                seconds=round(self._restored["seconds"], 4), notes=loaded.get("notes", []),
            )  # fmt: skip
        return step + 1

    @property
    def restored(self) -> dict[str, Any]:
        """The plain values :meth:`restore` loaded from a checkpoint; empty on a fresh start.

        Mutable ones are the very objects that were registered, now filled in place.

        >>> epoch = run.restored.get("epoch", 0)
        """
        return dict(self._values)

    def state(self, name: str) -> Any:
        """The current value of the plain value registered as ``name`` (restored, or as given).

        >>> epoch = run.state("epoch")
        """
        registered = {**self._objects, **self._per_rank}
        if name not in registered:
            raise KeyError(
                f"{name!r} is not registered; register it with run.restore({name}=...) "
                f"(registered: {sorted(registered)})"
            )
        return registered[name]

    def update_state(self, **values: Any) -> None:
        """Replace registered plain values; the next checkpoint saves the new ones.

        For immutable values (an epoch counter, the best loss so far) that the script
        rebinds: the checkpoint holds what was last given here, or to :meth:`restore`.

        >>> run.update_state(epoch=epoch, best_loss=best_loss)
        """

        def stateful(obj: Any) -> bool:  # checkpoint.state's test, without importing torch
            return callable(getattr(obj, "state_dict", None)) and callable(
                getattr(obj, "load_state_dict", None)
            )

        for name, value in values.items():
            target = self._per_rank if name in self._per_rank else self._objects
            if name not in target:
                raise KeyError(
                    f"{name!r} is not registered; register it first with "
                    f"run.restore({name}=...) so that it is saved and restored"
                )
            if stateful(target[name]) or stateful(value):
                raise ValueError(
                    f"{name!r} is an object with state_dict(); it is saved from the object "
                    "itself, update_state() is for plain values (numbers, dicts, lists)"
                )
            target[name] = value

    def _agreed_resume_path(self, store: Any, resume: str) -> Path:
        """Rank 0 verifies the checkpoint (one re-read, not one per rank); all load it."""
        group = self._rank_group()
        if group is None:  # no torch.distributed: each rank verifies for itself
            return self._verified_resume_path(store, resume)
        chosen: tuple[str | None, str | None] = (None, None)
        if self.rank == 0:
            try:
                chosen = (str(self._verified_resume_path(store, resume)), None)
            except Exception as exc:  # every rank raises it, not only rank 0
                chosen = (None, str(exc))
        path, error = group.broadcast(chosen)
        if error is not None or path is None:
            raise RuntimeError(error or "rank 0 found no checkpoint to resume from")
        return Path(path)

    def _verified_resume_path(self, store: Any, resume: str) -> Path:
        """``resume`` if it verifies, else the newest checkpoint that does."""
        path = Path(resume)
        step_dir = int(path.name.split("-", 1)[1]) if path.name.startswith("step-") else None
        result = (
            store.verify(step_dir) if step_dir is not None and path.parent == store.root else None
        )
        if result is None or not result.ok:
            info = store.latest_verified()
            if info is None:
                raise RuntimeError(
                    f"cannot resume: {resume} failed verification and no older checkpoint in "
                    f"{store.root} verifies; see the quarantine/ folder there"
                )
            path = info.path
        return path

    def checkpoint(
        self, step: int, *, block: bool = False, metrics: dict[str, float] | None = None
    ) -> None:
        """Save the registered objects as the state after ``step`` (async, atomic, verified).

        Blocks only while the state is copied to host memory; ``block=True`` waits for
        the commit. A failed save is recorded at once and raised on the next call.
        """
        if self.drill:
            return
        if not self._objects and not self._per_rank:
            raise RuntimeError(
                "nothing to checkpoint: call run.restore(model=..., optimizer=...) first"
            )
        if self.ranks.distributed and self._rank_group() is None:
            raise RuntimeError(
                f"this run has {self.world_size} processes: call "
                "torch.distributed.init_process_group() before run.checkpoint(), so that "
                "the ranks can agree on the commit"
            )
        if self._checkpointer is None:
            self._checkpointer = self._make_checkpointer()
        values = {k: float(v) for k, v in (metrics or self._values_of(step)).items()}
        if self.ranks.distributed:
            self._checkpointer.save(
                step, self._objects, per_rank=self._per_rank, metrics=values, block=block
            )
        else:
            objects = {**self._objects, **self._per_rank}
            self._checkpointer.save(step, objects, metrics=values, block=block)
        self._last_saved_step = step
        self._last_save_time = time.monotonic()

    def _values_of(self, step: int) -> dict[str, Any]:
        """The values logged for ``step``: what its checkpoint stores (keep_best ranks them).

        Inside :meth:`steps` a checkpoint of the current step is taken before its event
        is written, so its values are still pending.
        """
        if self._in_steps and self._phase[1] == step:
            return {k: v for k, v in self._pending.items() if isinstance(v, int | float)}
        return self._last_values if self._last_values_step == step else {}

    def maybe_checkpoint(self, step: int) -> bool:
        """Checkpoint when the spec's interval (``every_steps``, ``every``) says so; True if saved.

        A stop request is also honoured here: the step just finished is saved, so a
        graceful preemption loses no work.
        """
        ck = self.spec.checkpoint
        due = self._stop_requested
        due = due or (ck.every_steps is not None and (step + 1) % ck.every_steps == 0)
        timed = ck.every is not None and time.monotonic() - self._last_save_time >= ck.every
        if ck.every is not None and (group := self._rank_group()) is not None:
            timed = group.agree(timed)  # clocks differ: all ranks save, or none
        due = due or timed
        if not due or self._last_saved_step == step:
            return False
        self.checkpoint(step, block=self._stop_requested)
        return True

    def _make_checkpointer(self) -> Any:
        from acceptrun.checkpoint.mirror import Mirror
        from acceptrun.checkpoint.saver import Checkpointer

        store = self._store()
        if self.rank == 0:  # rank 0 owns the root: the others write inside its saves
            store.remove_stale_staging()
        mirror = None
        if self.spec.checkpoint.mirror and self.rank == 0:
            mirror = Mirror(
                f"{self.spec.checkpoint.mirror.rstrip('/')}/{self.run_id}",
                state_path=self.record.file("mirror.json"),
                on_event=self._event_sink,
            )
            mirror.start()
        prov = self.record.read_json("provenance.json") or {}
        meta = {
            "run_id": self.run_id,
            "attempt": self.attempt,
            "spec_hash": self.record.state.get("spec_hash") or self.spec.hash,
            "provenance_hash": prov.get("hashes", {}).get("all"),
        }
        return Checkpointer(
            store, mirror=mirror, meta=meta,
            on_event=self._event_sink, ranks=self._group,
        )  # fmt: skip

    # ---- supervision aids -------------------------------------------------------------------

    def _start_watch_aids(self) -> None:
        """Heartbeats, stack dumps on SIGUSR2, and the faults a drill asked for."""
        adir = self.record.attempt_dir(self.attempt)
        adir.mkdir(parents=True, exist_ok=True)
        if threading.current_thread() is threading.main_thread():
            import faulthandler

            # Before killing a hung attempt the supervisor sends SIGUSR2: every thread's
            # Python stack lands in stacks.txt, written from C, even with the GIL held.
            # One file per rank (torchrun forwards SIGUSR2 to all): interleaved dumps are unreadable.
            name = "stacks.txt" if self.rank == 0 else f"stacks-rank{self.rank}.txt"
            self._stacks_file = open(adir / name, "a")  # noqa: SIM115 - kept open for the handler
            faulthandler.register(signal.SIGUSR2, file=self._stacks_file, all_threads=True)
        if self.rank == 0:
            # Rank 0's heartbeats are enough: a rank stuck anywhere holds rank 0 in the
            # step's next collective, where its phase says "step" (a hang).
            interval = float(os.environ.get(ENV_HEARTBEAT_S) or HEARTBEAT_S)
            threading.Thread(
                target=self._heartbeat, args=(interval,), name="acceptrun-heartbeat", daemon=True
            ).start()
        if os.environ.get(ENV_INJECT) and self.rank == int(os.environ.get(ENV_INJECT_RANK) or 0):
            from acceptrun.workload import inject

            self._faults = inject.faults_for_attempt(os.environ[ENV_INJECT], self.attempt)

    def _heartbeat(self, interval: float) -> None:
        # A thread of its own: it keeps beating while the main thread is inside a C call
        # (a collective, a data-loader wait), which is how a hang is told from a crash.
        while not self.finished:
            time.sleep(interval)
            phase, step, since = self._phase
            try:
                self.record.event(
                    "heartbeat",
                    attempt=self.attempt,
                    phase=phase,
                    step=step,
                    phase_s=round(time.time() - since, 3),
                )
            except Exception:  # the record went away, or the interpreter is shutting down
                return

    def _fire_faults(self, step: int, phase: str) -> None:
        from acceptrun.workload import inject

        inject.fire(self, step, phase)

    def _event_sink(self, kind: str, fields: dict[str, Any]) -> None:
        if self.rank != 0 and not kind.endswith("_failed"):
            return  # rank 0 records the run's checkpoints; a rank's own failure it tells
        self.record.event(kind, attempt=self.attempt, **fields, **self._rank_field())

    def _lifecycle_event(self, kind: str, fields: dict[str, Any]) -> None:
        self.record.event(kind, sync=True, attempt=self.attempt, **fields)

    def _finish_drill(self, step: int, seconds: float) -> None:
        restored = self._restored or {}
        ok = bool(restored) and all(
            isinstance(v, int | float) and v == v and abs(v) != float("inf")
            for v in self._last_values.values()
        )
        values = (
            ", ".join(f"{k}={v:.6g}" for k, v in self._last_values.items()) or "no values logged"
        )
        evidence = (
            f"restored step {restored.get('step')} in {restored.get('seconds', 0):.2f}s and ran step {step} ({values})"
            if restored
            else "nothing was restored: the workload never called run.restore() or had no checkpoint"
        )
        self.record.event(
            "drill", sync=True, drill=self.drill, ok=ok, step=step, evidence=evidence,
            **self._rank_field(),
        )  # fmt: skip
        raise SystemExit(0 if ok else 1)

    # ---- results ------------------------------------------------------------------------------

    def metric(self, name: str, value: float, *, step: int | None = None) -> None:
        """Record a final (or evaluation) metric; acceptance thresholds read the last value."""
        if not name:
            raise ValueError("metric name is empty; use a name such as 'eval/accuracy'")
        if self.drill or self.rank != 0:
            return
        fields: dict[str, Any] = {"attempt": self.attempt, "name": name, "value": _number(value)}
        if step is not None:
            fields["step"] = step
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
            raise FileNotFoundError(
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
        if self._checkpointer is not None:
            try:
                self._checkpointer.close()
            except Exception as exc:  # the exit status still gets recorded
                status = f"error: {type(exc).__name__}: {exc}" if status == "ok" else status
        if self.drill:
            return
        if self.rank != 0 and not status.startswith("error"):
            return  # rank 0 reports the end; another rank only its own error
        self.record.event(
            "workload_end", sync=True, attempt=self.attempt, status=status, **self._rank_field()
        )
        if not self.supervised:
            from acceptrun.run.close import close_standalone

            close_standalone(self.record, status=status)

    # ---- signals ------------------------------------------------------------------------------

    def _on_stop_signal(self, signum: int, frame: types.FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A forked data-loader worker inherited this handler. The main process owns
            # the stop (checkpoint, then exit); a worker that died here would instead
            # crash the loop with "DataLoader worker killed". It ends with its parent.
            return
        if self._stopping:
            # Already checkpointing to exit. The signal comes again when a stop reaches
            # the workload twice: torchrun's agent repeats it, and under Slurm both the
            # job step and the supervisor send it. A second one must not kill the save.
            return
        if not (self._in_steps or self._loop_stops):
            # Not in a loop we control: behave as if we had never installed a handler.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self._stop_signal = True
        if not self.ranks.distributed:
            self._stop_requested = True  # one process: no one to agree with
        if self.rank == 0:
            self.record.event(
                "stop_requested", attempt=self.attempt, signal=signal.Signals(signum).name
            )

    def _at_exit(self) -> None:
        if self.finished:
            return
        status = "ok"
        if self._stop_requested:
            status = "stopped"
        elif self._exception is not None:
            status = f"error: {type(self._exception).__name__}: {self._exception}"
        self.finish(status)

    def _excepthook(
        self, tp: type[BaseException], value: BaseException, tb: types.TracebackType | None
    ) -> None:
        self._exception = value
        sys.__excepthook__(tp, value, tb)

    def __repr__(self) -> str:
        mode = "supervised" if self.supervised else "standalone"
        return f"<Run {self.run_id} attempt={self.attempt} {mode}>"


def init(name: str | None = None, *, workspace: str | os.PathLike[str] | None = None) -> Run:
    """Attach to the supervisor's run, or create a standalone run when there is none.

    Calling it twice returns the same :class:`Run`. ``name`` and ``workspace`` apply to
    standalone runs only (default name: the script's file name).

    >>> run = acceptrun.init()
    """
    global _active
    if _active is not None and not _active.finished:
        return _active
    run_dir = os.environ.get(ENV_RUN_DIR)
    world = os.environ.get("WORLD_SIZE")
    if not run_dir and world not in (None, "", "1"):
        raise RuntimeError(
            f"WORLD_SIZE={world}: a run of several processes is recorded by the supervisor; "
            "start it with `acceptrun run spec.toml` and resources.processes in the spec, "
            "not with torchrun directly"
        )
    if run_dir:
        record = RunRecord(run_dir)
        if not record.exists("run.json"):
            raise RuntimeError(f"${ENV_RUN_DIR} is {run_dir!r}, which is not a run record")
        run = Run(record, attempt=int(os.environ.get(ENV_ATTEMPT, "1")), supervised=True)
    else:
        run = Run(_create_standalone(name, workspace), attempt=1, supervised=False)
    if run.rank == 0:
        size: dict[str, Any] = {"world_size": run.world_size} if run.ranks.distributed else {}
        run.record.event(
            "workload_start", attempt=run.attempt, pid=os.getpid(), resume_from=run.resume_from,
            **size,
        )  # fmt: skip
    atexit.register(run._at_exit)
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
        spec_text=spec.to_toml(),
        state={"mode": "standalone", "status": "running", "started_at": now_iso(), "attempts": 1},
    )
    prov = provenance.capture(diff_path=record.file("git.diff"), exclude=[ws.root])
    record.write_json("provenance.json", prov)
    return record


def _closed_by_break() -> bool:
    """Whether the ``for`` loop over :meth:`Run.steps` ended by ``break``/``return``.

    Called while the generator handles GeneratorExit: the loop's frame is the caller,
    and it is at the POP_TOP that drops the iterator after a ``break`` or ``return``;
    an exception unwinding the loop leaves it at the instruction that raised. (A
    CPython detail: elsewhere, or for a generator closed another way, False.)
    """
    import dis

    frame = sys._getframe(2)  # 0: here, 1: steps(), 2: the loop that closed it
    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] == dis.opmap["POP_TOP"]


def _number(value: Any) -> float | int:
    """A plain float/int from Python, NumPy or 0-d torch values (no torch import)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    item = getattr(value, "item", None)
    if callable(item):
        out = item()
        if isinstance(out, int | float):
            return out
    return float(value)
