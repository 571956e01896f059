"""Hugging Face ``Trainer``: two added lines make a training script an accepted run.

::

    from acceptrun.integrations.transformers import AcceptrunCallback   # acceptrun
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[AcceptrunCallback()])                 # acceptrun
    trainer.train()

What the callback does (docs/frameworks/transformers.md has the measured figures):

* attaches to the run (``acceptrun.init()``; a standalone run under a plain ``python``);
* writes a step event per optimizer step (``global_step``: 1 is the first step, so the
  checkpoint of step N is ``checkpoint-N``) with step time, data wait, samples, tokens
  when the Trainer counts them, loss, learning rate and grad norm when the Trainer logs
  them, and ``total_steps`` for the ETA; evaluation results become metric events with the
  Trainer's names (``eval_loss``);
* captures each ``checkpoint-N/`` in ``on_save`` into the run's checkpoint store
  (hashed, verified, retained by the spec, mirrored). The Trainer's
  ``save_total_limit`` rotation runs inside the save, before ``on_save``, and only
  removes older directories, each already captured by its own ``on_save``: acceptrun
  keeps its own copies under its own retention;
* on a restart resumes from the newest verified checkpoint without
  ``resume_from_checkpoint``: see :func:`_install_train_default`;
* turns a graceful stop (SIGTERM from the supervisor) into a save at the next step
  boundary, then exits 143 once that save is captured (a ``stopped`` event);
* registers the files ``trainer.save_model()`` writes as outputs ``model/<file>``;
* records the Trainer's end-of-train figures (``train_loss``, ``train_runtime``,
  ``train_samples_per_second``, ``train_steps_per_second``) as metrics of one attempt:
  they are computed over the attempt's own steps and time, not the run's, so they are
  marked ``per_attempt`` and refused as acceptance metrics (workload/aggregates.py).

Importing ``acceptrun`` never imports this module or transformers.
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from acceptrun.errors import UserError
from acceptrun.integrations._base import FrameworkRun
from acceptrun.workload.aggregates import PER_ATTEMPT, marks

__all__ = ["AcceptrunCallback"]

PREFIX = "checkpoint"  # the Trainer's directory name: <output_dir>/checkpoint-<global_step>


class AcceptrunCallback(TrainerCallback):
    """Record a Trainer's steps, checkpoints, stops and model as an acceptrun run.

    >>> trainer = Trainer(model=model, args=args, train_dataset=ds,
    ...                   callbacks=[AcceptrunCallback()])
    >>> trainer.train()          # resumes from the newest verified checkpoint on a restart
    """

    def __init__(self, name: str | None = None) -> None:
        self.fr = FrameworkRun.attach(name, one_process=True)
        self.run = self.fr.run
        self.resumed_from: int | None = None  # the step put back at train(), if any
        self._total: int | None = None
        self._boundary = time.perf_counter()  # end of the previous step's own work
        self._step_begin: float | None = None
        self._pending: dict[str, Any] | None = None  # a step event waiting for on_log
        self._tokens_seen = 0
        self._values: dict[str, float] = {}  # loss and eval metrics for checkpoint metrics
        _install_train_default()

    # ---- resume (called by Trainer.train, see _install_train_default) ---------------------

    def resume_into(self, output_dir: str | os.PathLike[str]) -> str | None:
        """Put the checkpoint to resume from back into ``output_dir``; its path, or None.

        ``checkpoint-M`` directories newer than it are what a killed attempt left
        unverified: they are removed (a ``stale_checkpoint_removed`` event each), or the
        Trainer's rotation and a later save of step M would mix them with this run.
        """
        info = self.fr.resume_point()
        if info is None:
            return None
        out = Path(output_dir)
        names = list((info.meta.get("files") or {}).keys())
        name = names[0] if len(names) == 1 else f"{PREFIX}-{info.step}"
        for old in sorted(out.glob(f"{PREFIX}-*")) if out.is_dir() else []:
            tail = old.name[len(PREFIX) + 1 :]
            if old.is_dir() and tail.isdigit() and int(tail) > info.step:
                shutil.rmtree(old)
                self.run.record.event(
                    "stale_checkpoint_removed", sync=True, attempt=self.run.attempt,
                    path=str(old), resumed_step=info.step,
                )  # fmt: skip
        placed = self.fr.put_back(info, {name: out / name})
        if self.run.drill:  # the client's drill check reads what was restored
            seconds = self.fr.restore_seconds or 0.0
            self.run._restored = {"step": info.step, "path": str(info.path), "seconds": seconds}
        self.resumed_from = info.step
        return str(placed[name])

    # ---- the Trainer's events -------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._total = int(state.max_steps) if state.max_steps else None
        self._tokens_seen = int(state.num_input_tokens_seen or 0)
        self._boundary = time.perf_counter()
        if self.fr.stop_requested:  # asked to stop before the first step: nothing new to save
            self.fr.exit_stopped(state.global_step)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._flush()
        self._step_begin = time.perf_counter()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        step = int(state.global_step)
        event: dict[str, Any] = {}
        event["samples"] = (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        )
        tokens = int(state.num_input_tokens_seen or 0)
        if tokens > self._tokens_seen:
            event["tokens"] = tokens - self._tokens_seen
            self._tokens_seen = tokens
        if self._total:
            event["total_steps"] = self._total
        self._pending = {"step": step, **event}
        if not control.should_log:  # else on_log adds the loss and writes it
            self._flush()
        # The stop boundary: on_step_end runs once per optimizer step on every rank.
        self._honour_stop(control, self.fr.should_stop(step))

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kw: Any,
    ) -> None:
        logs = logs or {}
        if self._pending is not None and self._pending["step"] == state.global_step:
            for key in ("loss", "learning_rate", "grad_norm"):
                if isinstance(logs.get(key), int | float):
                    self._pending[key] = logs[key]
            if "loss" in self._pending:
                self._values["loss"] = float(self._pending["loss"])
            self._flush()
        elif "train_loss" in logs and not self.run.drill:  # the Trainer's summary at the end
            # Averages over this attempt's train() call: recorded as such (per_attempt),
            # and refused as acceptance metrics (workload/aggregates.py).
            for name in PER_ATTEMPT["transformers"]:
                value = logs.get(name)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    self.run.metric(
                        name, float(value), step=state.global_step,
                        **marks("transformers", name),
                    )  # fmt: skip
        self._honour_stop(control, self.fr.stop_requested)

    def on_evaluate(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: dict[str, Any] | None = None,
        **kw: Any,
    ) -> None:
        for name, value in (metrics or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool) and name != "epoch":
                self.run.metric(name, value, step=state.global_step)
                self._values[name] = float(value)
        self._boundary = time.perf_counter()  # evaluation is not the next step's time

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._flush()
        step = int(state.global_step)
        if not args.should_save or self.run.drill:
            return
        folder = Path(args.output_dir or ".") / f"{PREFIX}-{step}"
        if not folder.is_dir():
            raise UserError(
                f"the Trainer saved step {step} but {folder} is not a directory; acceptrun "
                "captures <output_dir>/checkpoint-<step> (hyperparameter search runs, which "
                "save elsewhere, are not supported)"
            )
        # Blocks training for one read of the checkpoint (docs: "cost of capture"); the
        # rotation of save_total_limit already ran, and the next one comes after this returns.
        self.fr.capture(
            step, {folder.name: folder}, metrics=self._values,
            meta={"framework": "transformers", "output_dir": str(folder.parent.absolute())},
        )  # fmt: skip
        self._boundary = time.perf_counter()
        if self.fr.stop_requested:
            self.fr.exit_stopped(step)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._flush()
        self.fr.close()

    # ---- helpers --------------------------------------------------------------------------

    def _honour_stop(self, control: TrainerControl, stop: bool) -> None:
        """A stop decided: save this step, then stop (``on_save`` exits once it is captured)."""
        if stop:
            control.should_save = True
            control.should_training_stop = True

    def _flush(self) -> None:
        """Write the held step event (through ``run.log``, which fires injected step faults).

        The step's time runs from the end of the previous step to now: written from
        ``on_log`` it includes the loss's ``.item()`` (on a GPU, the wait for the step to
        finish). Data wait is the part before ``on_step_begin``, where the Trainer fetches
        the step's batches. Evaluation and checkpoint captures move the start past them.
        """
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        now = time.perf_counter()
        step = pending.pop("step")
        step_time = now - self._boundary
        pending["step_time"] = step_time
        if self._step_begin is not None and self._step_begin >= self._boundary:
            pending["data_wait"] = self._step_begin - self._boundary
        self._boundary = now
        self.fr.log(step, **pending)
        if self.run.drill:
            self.run._finish_drill(step, step_time)

    def register_model(self, output_dir: str | os.PathLike[str]) -> None:
        """Register every file ``save_model`` wrote directly in ``output_dir`` as ``model/<file>``."""
        if self.run.drill:
            return
        for path in sorted(Path(output_dir).iterdir()):
            if path.is_file() and not path.name.startswith("."):
                self.run.output(f"model/{path.name}", path)


def _callback_of(trainer: Any) -> AcceptrunCallback | None:
    handler = getattr(trainer, "callback_handler", None)
    for cb in getattr(handler, "callbacks", []):
        if isinstance(cb, AcceptrunCallback):
            return cb
    return None


def _install_train_default() -> None:
    """Make ``Trainer.train()`` and ``save_model()`` acceptrun-aware, for trainers with the callback.

    A callback cannot choose the checkpoint a Trainer resumes from: ``train()`` reads
    ``resume_from_checkpoint`` before any callback event. So ``Trainer.train`` is wrapped
    once per process: for a trainer holding an :class:`AcceptrunCallback` and called with
    ``resume_from_checkpoint=None``, the newest verified checkpoint is put back into
    ``output_dir`` and its path passed on; an explicit argument is left alone, and
    trainers without the callback are untouched. ``save_model`` is wrapped the same way
    to register the model files as outputs (not its internal calls, the checkpoints).
    """
    if getattr(Trainer.train, "_acceptrun", False):
        return
    train, save_model = Trainer.train, Trainer.save_model

    @functools.wraps(train)
    def train_with_resume(
        self: Any, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        cb = _callback_of(self)
        if cb is not None and resume_from_checkpoint is None:
            resume_from_checkpoint = cb.resume_into(self.args.output_dir)
        return train(self, resume_from_checkpoint, *args, **kwargs)

    @functools.wraps(save_model)
    def save_model_registered(
        self: Any, output_dir: str | None = None, _internal_call: bool = False
    ) -> Any:
        result = save_model(self, output_dir, _internal_call=_internal_call)
        cb = _callback_of(self)
        if cb is not None and not _internal_call and self.args.should_save:
            cb.register_model(output_dir or self.args.output_dir)
        return result

    train_with_resume._acceptrun = True  # type: ignore[attr-defined]
    Trainer.train = train_with_resume  # type: ignore[method-assign]
    Trainer.save_model = save_model_registered  # type: ignore[method-assign]
