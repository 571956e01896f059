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
from typing import Any

from acceptrun.durable import write_atomic
from acceptrun.hashing import hash_file
from acceptrun.workspace import RunRecord, find_workspace, now_iso

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
        self._last_saved_step: int | None = None
        self._last_save_time = time.monotonic()
        self._restored: dict[str, Any] | None = None
        self._spec: Any = None
        # What the loop is doing, for the heartbeat thread: (phase, step, since unix s).
        self._phase: tuple[str, int | None, float] = ("startup", None, time.time())
        self._faults: list[Any] = []
        self._stacks_file: Any = None

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
        if self.drill and start >= total > 0:
            # A drill of a finished run restores its final checkpoint: still run one step.
            start = total - 1
        self._in_steps = True
        step = start
        try:
            while step < total:
                if self._stop_requested:
                    self._stop_at(step)
                t0 = time.perf_counter()
                self._data_wait = 0.0
                self._phase = ("step", step, time.time())
                yield step
                if self._faults:
                    self._fire_faults(step, "before_emit")
                self._emit_step(step, time.perf_counter() - t0)
                if self._faults:
                    self._fire_faults(step, "after_step")
                if self.drill:
                    self._finish_drill(step, time.perf_counter() - t0)
                step += 1
        finally:
            self._in_steps = False

    def _stop_at(self, step: int) -> None:
        """A stop request at a step boundary: checkpoint what is done, then exit 143."""
        self._in_steps = False
        saved = None
        if self._objects and step > 0 and self._last_saved_step != step - 1:
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
        )
        raise SystemExit(143)

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
        Cost: one appended JSON line per step; on a GPU, the ``.item()`` that produces
        a loss value is the expensive part (a device sync), not this call.
        """
        clean = {k: _number(v) for k, v in values.items()}
        if self._in_steps:
            self._pending.update(clean)
            return
        now = time.perf_counter()
        step_time = None if self._last_log is None else now - self._last_log
        self._last_log = now
        self._pending.update(clean)
        self._emit_step(step, step_time)

    def _emit_step(self, step: int, step_time: float | None) -> None:
        self._last_values = {k: v for k, v in self._pending.items() if isinstance(v, int | float)}
        if self.drill:
            return  # a drill proves the restore; its step is not part of the run
        event: dict[str, Any] = {"attempt": self.attempt, "step": step}
        if step_time is not None:
            event["step_time"] = round(step_time, 6)
        if self._data_wait:
            event["data_wait"] = round(self._data_wait, 6)
        event.update(self._pending)
        self._pending = {}
        self.record.event("step", **event)
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
            "diverged", sync=True, attempt=self.attempt, step=step, loss=str(loss), reason=reason
        )
        self._in_steps = False
        raise SystemExit(EXIT_DIVERGED)

    @property
    def stop_requested(self) -> bool:
        """True once the supervisor (or a preemption) asked the workload to stop."""
        return self._stop_requested

    # ---- checkpoints ----------------------------------------------------------------------------

    @property
    def spec(self) -> Any:
        """The frozen :class:`~acceptrun.spec.RunSpec` of this run (checkpoint intervals...)."""
        if self._spec is None:
            from acceptrun.spec import load_spec

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

    def restore(self, *, map_location: str | None = None, **objects: Any) -> int:
        """Register what a checkpoint holds and restore it when resuming; returns the start step.

        ``objects`` are things with ``state_dict()``/``load_state_dict()`` (model,
        optimizer, scheduler, GradScaler, :class:`~acceptrun.checkpoint.ResumableLoader`)
        or plain JSON-able values. The RNG states (Python, NumPy, torch, CUDA) are always
        included. On a fresh start nothing is loaded and 0 is returned; when the
        supervisor resumes the run, the checkpoint is verified, loaded (tensors onto
        ``map_location``, default CPU, then each object copies to its own device) and
        the step after the checkpoint's is returned.

        >>> start = run.restore(model=model, optimizer=opt, scheduler=sched)
        """
        self._objects = dict(objects)
        resume = self.resume_from
        if not resume:
            return 0
        from acceptrun.checkpoint.state import load_into

        store = self._store()
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
        t0 = time.perf_counter()
        loaded = load_into(path, self._objects, device=map_location)
        manifest = store.get(int(path.name.split("-", 1)[1]))
        step = manifest.step if manifest is not None else int(path.name.split("-", 1)[1])
        self._restored = {"step": step, "path": str(path), "seconds": time.perf_counter() - t0}
        self._last_saved_step = step
        if not self.drill:
            self.record.event(
                "restored", sync=True, attempt=self.attempt, step=step, path=str(path),
                seconds=round(self._restored["seconds"], 4), notes=loaded.get("notes", []),
            )  # fmt: skip
        return step + 1

    def checkpoint(
        self, step: int, *, block: bool = False, metrics: dict[str, float] | None = None
    ) -> None:
        """Save the registered objects as the state after ``step`` (async, atomic, verified).

        Blocks only while the state is copied to host memory; ``block=True`` waits for
        the commit. A failed save is recorded at once and raised on the next call.
        """
        if self.drill:
            return
        if not self._objects:
            raise RuntimeError(
                "nothing to checkpoint: call run.restore(model=..., optimizer=...) first"
            )
        if self._checkpointer is None:
            self._checkpointer = self._make_checkpointer()
        values = {k: float(v) for k, v in (metrics or self._last_values).items()}
        self._checkpointer.save(step, self._objects, metrics=values, block=block)
        self._last_saved_step = step
        self._last_save_time = time.monotonic()

    def maybe_checkpoint(self, step: int) -> bool:
        """Checkpoint when the spec's interval (``every_steps``, ``every``) says so; True if saved.

        A stop request is also honoured here: the step just finished is saved, so a
        graceful preemption loses no work.
        """
        ck = self.spec.checkpoint
        due = self._stop_requested
        due = due or (ck.every_steps is not None and (step + 1) % ck.every_steps == 0)
        due = due or (ck.every is not None and time.monotonic() - self._last_save_time >= ck.every)
        if not due or self._last_saved_step == step:
            return False
        self.checkpoint(step, block=self._stop_requested)
        return True

    def _make_checkpointer(self) -> Any:
        from acceptrun.checkpoint.mirror import Mirror
        from acceptrun.checkpoint.saver import Checkpointer

        store = self._store()
        store.remove_stale_staging()
        mirror = None
        if self.spec.checkpoint.mirror:
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
            on_event=self._event_sink,
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
            self._stacks_file = open(adir / "stacks.txt", "a")  # noqa: SIM115 - kept open for the handler
            faulthandler.register(signal.SIGUSR2, file=self._stacks_file, all_threads=True)
        interval = float(os.environ.get(ENV_HEARTBEAT_S) or HEARTBEAT_S)
        threading.Thread(
            target=self._heartbeat, args=(interval,), name="acceptrun-heartbeat", daemon=True
        ).start()
        if os.environ.get(ENV_INJECT):
            from acceptrun import inject

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
        from acceptrun import inject

        inject.fire(self, step, phase)

    def _event_sink(self, kind: str, fields: dict[str, Any]) -> None:
        self.record.event(kind, attempt=self.attempt, **fields)

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
        self.record.event("drill", sync=True, drill=self.drill, ok=ok, step=step, evidence=evidence)
        raise SystemExit(0 if ok else 1)

    # ---- results ------------------------------------------------------------------------------

    def metric(self, name: str, value: float, *, step: int | None = None) -> None:
        """Record a final (or evaluation) metric; acceptance thresholds read the last value."""
        if not name:
            raise ValueError("metric name is empty; use a name such as 'eval/accuracy'")
        if self.drill:
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
        the record keeps a reference (large models stay where they are).
        """
        src = Path(path).resolve()
        if self.drill:
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
        self.record.event("workload_end", sync=True, attempt=self.attempt, status=status)
        if not self.supervised:
            from acceptrun.close import close_standalone

            close_standalone(self.record, status=status)

    # ---- signals ------------------------------------------------------------------------------

    def _on_stop_signal(self, signum: int, frame: types.FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A forked data-loader worker inherited this handler. The main process owns
            # the stop (checkpoint, then exit); a worker that died here would instead
            # crash the loop with "DataLoader worker killed". It ends with its parent.
            return
        if not self._in_steps:
            # Not in a loop we control: behave as if we had never installed a handler.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self._stop_requested = True
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
    if run_dir:
        record = RunRecord(run_dir)
        if not record.exists("run.json"):
            raise RuntimeError(f"${ENV_RUN_DIR} is {run_dir!r}, which is not a run record")
        run = Run(record, attempt=int(os.environ.get(ENV_ATTEMPT, "1")), supervised=True)
    else:
        run = Run(_create_standalone(name, workspace), attempt=1, supervised=False)
    run.record.event(
        "workload_start", attempt=run.attempt, pid=os.getpid(), resume_from=run.resume_from
    )
    atexit.register(run._at_exit)
    previous = sys.excepthook
    if previous is sys.__excepthook__:
        sys.excepthook = run._excepthook
    if threading.current_thread() is threading.main_thread() and run.supervised:
        signal.signal(signal.SIGTERM, run._on_stop_signal)
    if run.supervised and not run.drill:
        run._start_watch_aids()
    _active = run
    return run


def _create_standalone(name: str | None, workspace: str | os.PathLike[str] | None) -> RunRecord:
    """A run record for a plain ``python train.py``: spec from argv, provenance now."""
    from acceptrun import provenance
    from acceptrun.spec import RunSpec

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
    record.write_json("provenance.json", provenance.capture(diff_path=record.file("git.diff")))
    return record


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
