"""PyTorch Lightning: two added lines make a training script an accepted run.

::

    from acceptrun.integrations.lightning import AcceptrunCallback        # acceptrun
    trainer = L.Trainer(max_steps=600, callbacks=[AcceptrunCallback()])   # acceptrun
    trainer.fit(model, train_loader, val_loader)

What the callback does (docs/frameworks/lightning.md has the measured figures):

* attaches to the run (``acceptrun.init()``; a standalone run under a plain ``python``);
* writes a step event per optimizer step, numbered like Lightning's ``global_step`` (the
  first step is 1, so ``epoch=0-step=100.ckpt`` is acceptrun's checkpoint of step 100),
  with step time, data wait, samples, loss, learning rate and ``total_steps`` for the
  ETA; validation results become metric events with Lightning's names;
* puts a :class:`CheckpointIO` of its own in front of the strategy's, so every ``.ckpt``
  Lightning writes (``ModelCheckpoint``, ``last.ckpt``, ``trainer.save_checkpoint``) is
  captured into the run's checkpoint store: hashed, verified, retained by the spec's
  ``keep_*``, mirrored. The files saved for one ``global_step`` form one checkpoint.
  ``ModelCheckpoint`` keeps deleting its own files (``save_top_k``); acceptrun's copies
  are separate and only its retention removes them;
* on a restart resumes from the newest VERIFIED checkpoint without ``ckpt_path``: see
  :meth:`AcceptrunCallback._resume_into`;
* makes the resumed run continue the interrupted one exactly on CPU: the training
  loader's data order and position, and the RNG states of Python, NumPy, torch (and
  CUDA) and of the loader's and sampler's generators (see :class:`~acceptrun.integrations._lightning_loader.ResumableLoader`);
  validation runs on an RNG of its own, so it never shifts the training's random streams;
* turns a graceful stop (SIGTERM from the supervisor) into a save at the next training
  batch boundary and exit status 143 (a ``stopped`` event);
* registers the final checkpoint as the output ``model`` (``output=`` renames it).

One process only (``resources.processes = 1``). Importing ``acceptrun`` never imports
this module or Lightning.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import shutil
import signal
import tempfile
import time
import warnings
import weakref
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO, CheckpointIO

from acceptrun.errors import AcceptrunRuntimeError, UserError
from acceptrun.integrations._base import FrameworkRun
from acceptrun.integrations._lightning_loader import (
    ResumableLoader,
    apply_rng,
    capture_rng,
    wrap_process_dataloader,
)

__all__ = ["AcceptrunCallback"]

OWN_CHECKPOINT = "acceptrun.ckpt"  # what the callback itself saves: at a stop, at the end
STATE_FORMAT = "acceptrun.lightning.callback/1"
_LIGHTNING = version("lightning")


class AcceptrunCallback(Callback):
    """Record a Lightning fit's steps, checkpoints, stops and final model as an acceptrun run.

    ``output``: the output name of the final checkpoint (None: register none).
    ``step_metrics``: names of values the module logs per step (``self.log("acc", ...)``)
    to add to each step event, besides loss, learning rate and samples.

    >>> trainer = L.Trainer(max_epochs=3, callbacks=[AcceptrunCallback()])
    >>> trainer.fit(model, loader)     # resumes from the newest verified checkpoint on a restart
    """

    def __init__(
        self,
        *,
        name: str | None = None,
        output: str | None = "model",
        step_metrics: tuple[str, ...] | list[str] = (),
    ) -> None:
        self.fr = FrameworkRun.attach(name, one_process=True)
        self.run = self.fr.run
        self.output = output
        self.step_metrics = tuple(step_metrics)
        self.resumed_from: int | None = None  # the step put back at fit(), if any
        self.notes: list[str] = []  # what could not be made exact, said once each
        self._trainer: Any = None
        self._fitting = False
        self._pending: dict[str, Any] | None = None  # .ckpt files of one step not yet captured
        self._captured_step: int | None = None
        self._final_file: Path | None = None
        self._expected_step: int | None = None  # global_step the resume must reach
        self._resume_rng: dict[str, Any] | None = None  # RNG "now" from the checkpoint
        self._resume_rng_applied = False
        self._rng_mark: dict[str, Any] | None = None  # training RNG before a validation
        self._loaders: list[ResumableLoader] = []
        self._saved_handler: Any = None
        self._total: int | None = None
        self._logged_step = -1
        self._samples = 0
        self._end_prev: float | None = None  # end of the previous step's hook
        self._excluded = 0.0  # seconds of saves and validation since then (not data wait)
        self._val_start: float | None = None
        self._step_values: dict[str, Any] = {}  # measured before the step's event

    # ---- set-up ------------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.world_size > 1:
            raise UserError(
                f"AcceptrunCallback runs in one process; this Trainer has {trainer.world_size} "
                f"(devices={trainer.num_devices}, num_nodes={trainer.num_nodes}); set "
                "devices=1, or record the ranks with the client API (docs/multi-process.md)"
            )
        self._trainer = trainer
        self._fitting = True
        strategy = trainer.strategy
        io = strategy.checkpoint_io
        if isinstance(io, AsyncCheckpointIO):
            raise UserError(
                "AcceptrunCallback captures each .ckpt once Lightning has written it, which "
                "AsyncCheckpointIO does not wait for; remove AsyncCheckpointIO from the "
                "Trainer's plugins (acceptrun's capture is the durable copy)"
            )
        if not isinstance(io, _AcceptrunIO):
            strategy.checkpoint_io = _AcceptrunIO(io, self)
        wrap_process_dataloader(strategy, self)
        self._own_stops()
        restored = self._resume_into(trainer)
        if restored is not None:
            self._continue_log_version(trainer, restored)

    def _own_stops(self) -> None:
        """SIGTERM marks a stop for the next batch boundary; Lightning's own reaction is off.

        Lightning chains the handler found at ``fit`` and sets ``received_sigterm``, on
        which its loops raise ``SIGTERMException`` (a SystemExit with status 0) at the end
        of the epoch or inside validation: a stopped run would look finished. This
        handler runs after Lightning's and clears that flag; acceptrun saves and exits 143.
        """
        if threading_main() and self._saved_handler is None:
            client = signal.getsignal(signal.SIGTERM)
            self._saved_handler = client
            ref = weakref.ref(self)

            def on_sigterm(signum: int, frame: Any) -> None:
                if callable(client):
                    client(signum, frame)
                me = ref()
                if me is not None and me._trainer is not None:
                    me._trainer._signal_connector.received_sigterm = False

            signal.signal(signal.SIGTERM, on_sigterm)

    def _resume_into(self, trainer: pl.Trainer) -> Path | None:
        """On a restart, make this ``fit`` load the newest verified checkpoint.

        The mechanism: ``Trainer.fit`` picks its checkpoint path before any callback
        runs, then calls ``_checkpoint_connector.resume_start(path)`` after ``setup`` (in
        ``_restore_modules_and_callbacks``, with ``None`` when no ``ckpt_path`` was
        given). ``setup`` puts the verified files back where they were written, then
        gives that connector a one-shot ``resume_start`` that fills in their path; the
        connector restores model, callbacks, loops, optimizers and schedulers as for
        ``fit(ckpt_path=...)``. ``on_train_start`` checks that ``global_step`` is the
        checkpoint's and raises if it is not, so a Lightning whose fit path changed
        fails loudly rather than training from scratch. A ``ckpt_path`` passed by the
        script wins, with a warning.
        """
        info = self.fr.resume_point()
        if info is None:
            return None
        meta = info.meta.get("lightning")
        if not isinstance(meta, dict) or meta.get("load") not in (info.meta.get("files") or {}):
            raise UserError(
                f"checkpoint {info.path} was not captured from Lightning's .ckpt files; "
                "resume it with the script that wrote it, or give this run a checkpoint.dir "
                "of its own"
            )
        targets, scratch = None, None
        if self.run.drill:  # a drill changes no file of the run: the copy goes to scratch
            scratch = Path(tempfile.mkdtemp(prefix="acceptrun-drill-"))
            targets = {name: scratch / name for name in info.meta["files"]}
        placed = self.fr.put_back(info, targets)
        path = placed[meta["load"]]
        if self.run.drill:  # the client's drill check reads what was restored
            self.run._restored = {"step": info.step, "path": str(info.path), "seconds": 0.0}
        self.resumed_from = info.step
        self._expected_step = int(meta["global_step"])
        self._captured_step = info.step
        conn = trainer._checkpoint_connector
        original = conn.resume_start

        def resume_start(checkpoint_path: Any = None, weights_only: Any = None) -> None:
            del conn.resume_start  # one shot: the class's method is back
            if checkpoint_path and Path(checkpoint_path).resolve() != path.resolve():
                warnings.warn(
                    f"acceptrun: trainer.fit(ckpt_path={str(checkpoint_path)!r}) is loaded as "
                    f"given, not the verified checkpoint of step {info.step} ({path}); drop "
                    "ckpt_path to resume where the supervisor says",
                    stacklevel=2,
                )
                self._expected_step = None
            else:
                checkpoint_path = str(path)
            original(checkpoint_path, weights_only=weights_only)
            if scratch is not None:  # loaded: the drill's copy has served
                shutil.rmtree(scratch, ignore_errors=True)

        setattr(conn, "resume_start", resume_start)  # noqa: B010 - an instance attribute, on purpose
        return None if self.run.drill else path

    def _continue_log_version(self, trainer: pl.Trainer, restored: Path) -> None:
        """A resumed fit writes into the version folder of the checkpoint it restored.

        Lightning's logger picks a new ``lightning_logs/version_N`` for every ``fit`` that
        does not name one, and ``ModelCheckpoint`` saves under the logger's folder: a
        resumed attempt would write its logs and checkpoints into ``version_1`` while the
        checkpoint it restored stays in ``version_0``. The logger's folder is created
        before any callback's ``setup`` (Lightning opens the logger's experiment first),
        so here, before ``ModelCheckpoint`` resolves its folder: a ``TensorBoardLogger``
        whose new folder holds nothing but the event file it just opened is moved back
        to the restored checkpoint's version (that file and folder removed, the writer
        reopened there; TensorBoard reads every event file of a folder). Where that
        cannot be done (a ``CSVLogger`` would delete the folder's ``metrics.csv`` when
        reopened there; another logger; a folder already written to), the run says so: a
        ``resume_note`` naming both folders, which the verdict's resumed line shows.
        """
        logger = trainer.logger
        root = getattr(logger, "root_dir", None)
        new_dir = getattr(logger, "log_dir", None)
        if logger is None or root is None or new_dir is None:
            return
        root_path, new_path = Path(root).resolve(), Path(new_dir).resolve()
        try:
            part = restored.resolve().relative_to(root_path).parts[0]
        except (ValueError, IndexError):
            return  # the checkpoint is not in a version folder of this logger: nothing splits
        old_path = root_path / part
        if new_path == old_path or new_path.parent != root_path or not old_path.is_dir():
            return
        from lightning.pytorch.loggers import TensorBoardLogger

        fresh = new_path.is_dir() and all(
            f.is_file() and f.name.startswith("events.out.tfevents.") for f in new_path.iterdir()
        )
        if isinstance(logger, TensorBoardLogger) and fresh:
            writer = getattr(logger, "_experiment", None)
            if writer is not None:
                writer.close()
            logger._experiment = None
            tail = part[len("version_") :]
            logger._version = int(tail) if part.startswith("version_") and tail.isdigit() else part
            for f in new_path.iterdir():
                f.unlink()
            new_path.rmdir()
            _ = logger.experiment  # reopened in the restored checkpoint's folder
            self._note(
                f"the logger continues in {old_path}, the folder of the restored checkpoint "
                f"(it had opened {new_path.name} for this attempt; removed, still empty)"
            )
            return
        kind = type(logger).__name__
        self._note(
            f"this attempt writes its logs and new checkpoints into {new_path}, the "
            f"checkpoint it restored is in {old_path}: the run's files are split across two "
            f"folders ({kind} cannot be moved back without losing what the folder holds); "
            f"give the logger a fixed version (e.g. {kind}(..., version=0)) so every "
            "attempt writes into one folder"
        )

    # ---- the loop ----------------------------------------------------------------------------

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._expected_step is not None and trainer.global_step != self._expected_step:
            raise AcceptrunRuntimeError(
                f"acceptrun put back the checkpoint of step {self.resumed_from} but Lightning "
                f"{_LIGHTNING} starts at global_step {trainer.global_step}: its fit path "
                "no longer calls _checkpoint_connector.resume_start after setup. Resume by "
                "hand with trainer.fit(..., ckpt_path=<the .ckpt put back>) and report it"
            )
        if self._resume_rng is not None and not self._loaders:
            self._apply_resume_rng()  # no loader of ours to do it at its first batch
        self._rng_mark = capture_rng({})
        total = trainer.estimated_stepping_batches
        self._total = int(total) if total != float("inf") else None
        self._logged_step = trainer.global_step
        self._end_prev = time.perf_counter()
        self._excluded = 0.0
        if self.fr.stop_requested:  # asked to stop before the first step: nothing new to save
            self._stop(trainer)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        if self._end_prev is not None:  # summed over the batches of one optimizer step
            wait = max(0.0, now - self._end_prev - self._excluded)
            self._step_values["data_wait"] = self._step_values.get("data_wait", 0.0) + wait
        self._excluded = 0.0
        self._flush()  # the previous step's .ckpt files: a checkpoint stall, not data wait
        self._excluded = 0.0

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._samples += _batch_size(batch)
        step = trainer.global_step
        if step != self._logged_step:  # an optimizer step ended (not an accumulation)
            self._logged_step = step
            values: dict[str, Any] = {**self._step_values}
            self._step_values = {}
            loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
            metrics = trainer.callback_metrics
            if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
                loss = metrics.get("train_loss", metrics.get("loss"))  # manual optimization
            if (value := _scalar(loss, finite=False)) is not None:
                values["loss"] = value  # NaN too: the divergence check reads it. A GPU sync
            values.update(_learning_rates(trainer))
            if self._samples:
                values["samples"] = self._samples
            self._samples = 0
            for name in self.step_metrics:
                if name in metrics and (v := _scalar(metrics[name])) is not None:
                    values[name] = v
            if self._total:
                values["total_steps"] = self._total
            self.fr.log(step, **values)  # injected faults (kill@step=N) fire here
            if self.run.drill:  # `acceptrun ckpt drill`: one step after the restore, then report
                self.run._finish_drill(step, 0.0)
            # The stop boundary: once per optimizer step, on every rank (sets stop_requested).
            self.fr.should_stop(step)
        self._rng_mark = capture_rng({})
        self._end_prev = time.perf_counter()
        if self.fr.stop_requested:
            self._stop(trainer)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._fitting and not trainer.sanity_checking:
            self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._fitting or trainer.sanity_checking:
            return
        if self._rng_mark is not None:
            # Validation (its loader's iterator included) drew from the global RNGs; put
            # the training's streams back so a run with a resume, which skips or repeats
            # validations, draws the same numbers as one without.
            apply_rng(self._rng_mark, {})
        if self._val_start is not None:
            self._excluded += time.perf_counter() - self._val_start
            self._val_start = None
        step = trainer.global_step
        for name, value in trainer.callback_metrics.items():
            if (v := _scalar(value)) is not None:
                self.run.metric(name, v, step=step)
        if self.fr.stop_requested:
            self._stop(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.fr.stop_requested:
            self._stop(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._flush()
        step = trainer.global_step
        if step > 0 and self._captured_step != step and not self.run.drill:
            trainer.save_checkpoint(self._own_path(trainer))
            self._flush()
        for name, value in trainer.callback_metrics.items():
            if (v := _scalar(value)) is not None:
                self.run.metric(name, v, step=step)
        if self.output and self._final_file is not None and self._final_file.is_file():
            self.run.output(self.output, self._final_file)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if isinstance(exception, SystemExit) and exception.code == 143:
            return  # our own graceful stop
        with contextlib.suppress(Exception):  # the failure being raised matters more
            self._flush()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or not self._fitting:
            return
        if self.run.drill and self.resumed_from is not None:
            # The drill restored the final checkpoint: the fit had no step left to run.
            self.run._finish_drill(trainer.global_step, 0.0)
        self._flush()
        self._fitting = False
        for loader in self._loaders:
            loader.unwrap()
        self._loaders = []
        if self._saved_handler is not None and threading_main():
            signal.signal(signal.SIGTERM, self._saved_handler)
            self._saved_handler = None
        self.fr.close()

    # ---- checkpoint state (inside every .ckpt) -----------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The RNG states at this save, restored before the next training batch on a resume."""
        gens = {}
        for loader in self._loaders:
            gens.update(loader.generators("loader"))
        return {"format": STATE_FORMAT, "rng": capture_rng(gens)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("format") == STATE_FORMAT:
            self._resume_rng = state_dict["rng"]
            self._resume_rng_applied = False
        else:
            self._note("the checkpoint holds no acceptrun RNG state: random streams restart")

    def _apply_resume_rng(self) -> None:
        """Put the RNG states of the resumed save back (once): global, and the loaders'."""
        if self._resume_rng is None or self._resume_rng_applied:
            return
        gens = {}
        for loader in self._loaders:
            gens.update(loader.generators("loader"))
        self._note_all(apply_rng(self._resume_rng, gens))
        self._resume_rng_applied = True

    # ---- captures ----------------------------------------------------------------------------

    def _saved(self, path: Path, global_step: int, seconds: float) -> None:
        """Lightning wrote ``path`` (through _AcceptrunIO): capture it with its step's files."""
        if not self._fitting or self.run.drill:
            return
        if self._pending is not None and self._pending["global_step"] != global_step:
            self._flush()
        if self._pending is None:
            self._pending = {"global_step": global_step, "files": {}, "seconds": 0.0}
        name = self._stored_name(path)
        self._pending["files"][name] = path
        self._pending["load"] = name  # the last file saved for a step has the newest state
        self._pending["seconds"] += seconds
        self._excluded += seconds

    def _before_remove(self, path: Path) -> None:
        """ModelCheckpoint is about to delete a file: capture it first if still pending."""
        if self._pending is not None and path in self._pending["files"].values():
            self._flush()

    def _flush(self) -> None:
        """Capture the pending files of one step as one checkpoint; a failure warns loudly.

        Lightning's file stays where it was written: a failed capture (a full disk) loses
        acceptrun's copy, not the training, and is recorded as checkpoint_failed.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        step = int(pending["global_step"])
        t0 = time.perf_counter()
        metrics = {k: v for k, v in _scalars(self._trainer).items()}
        meta = {
            "lightning": {
                "load": pending["load"],
                "global_step": step,
                "epoch": int(self._trainer.current_epoch) if self._trainer is not None else None,
                "version": _LIGHTNING,
                "save_s": round(float(pending["seconds"]), 6),
            }
        }
        try:
            self.fr.capture(step, pending["files"], metrics=metrics, meta=meta)
        except Exception as exc:
            warnings.warn(
                f"acceptrun: the checkpoint of step {step} ({', '.join(pending['files'])}) was "
                f"not captured ({type(exc).__name__}: {exc}); Lightning's file is intact, the "
                "next save retries",
                stacklevel=2,
            )
        else:
            self._captured_step = step
            self._final_file = Path(pending["files"][pending["load"]])
        self._excluded += time.perf_counter() - t0

    def _stored_name(self, path: Path) -> str:
        """The name of a .ckpt inside the checkpoint: its path under default_root_dir."""
        root = Path(self._trainer.default_root_dir).resolve() if self._trainer else Path.cwd()
        full = Path(path).resolve()
        try:
            return full.relative_to(root).as_posix()
        except ValueError:
            digest = hashlib.sha256(str(full.parent).encode()).hexdigest()[:8]
            return f"outside-{digest}/{full.name}"

    def _own_path(self, trainer: pl.Trainer) -> Path:
        ckpt = trainer.checkpoint_callback
        dirpath = getattr(ckpt, "dirpath", None) if isinstance(ckpt, ModelCheckpoint) else None
        folder = Path(dirpath) if dirpath else Path(trainer.default_root_dir) / "checkpoints"
        return folder / OWN_CHECKPOINT

    # ---- stops -------------------------------------------------------------------------------

    def _stop(self, trainer: pl.Trainer) -> None:
        """Save the state after the last finished step (unless captured), then exit 143."""
        self._flush()
        step = trainer.global_step
        if self._captured_step != step and not self.run.drill:
            trainer.save_checkpoint(self._own_path(trainer))
            self._flush()
        self.fr.exit_stopped(step)

    # ---- notes -------------------------------------------------------------------------------

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
            warnings.warn(f"acceptrun: {text}", stacklevel=3)
            self.run.record.event("resume_note", attempt=self.run.attempt, note=text)

    def _note_all(self, texts: list[str]) -> None:
        for text in texts:
            self._note(text)


class _AcceptrunIO(CheckpointIO):
    """The strategy's CheckpointIO, with each completed save handed to the callback."""

    def __init__(self, inner: CheckpointIO, callback: AcceptrunCallback) -> None:
        self.inner = inner
        self.callback = callback

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if self.callback.run.drill:
            return  # a restore drill writes nothing outside its scratch copy
        t0 = time.perf_counter()
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        step = int(checkpoint.get("global_step", 0))
        self.callback._saved(Path(path), step, time.perf_counter() - t0)

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        return self.inner.load_checkpoint(
            path, map_location=map_location, weights_only=weights_only
        )

    def remove_checkpoint(self, path: Any) -> None:
        if self.callback.run.drill:
            return
        self.callback._before_remove(Path(path))
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


# ---- small helpers -----------------------------------------------------------------------------


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _scalar(value: Any, *, finite: bool = True) -> float | None:
    """A float from a number or a one-element tensor (finite only, unless told); else None."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return None
        value = value.detach().item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if not finite or math.isfinite(number) else None


def _scalars(trainer: Any) -> dict[str, float]:
    if trainer is None:
        return {}
    return {k: v for k, raw in trainer.callback_metrics.items() if (v := _scalar(raw)) is not None}


def _learning_rates(trainer: Any) -> dict[str, float]:
    """``lr`` of the first parameter group; ``lr/<i>`` per optimizer when there are several."""
    optimizers = list(trainer.optimizers)
    out = {}
    for i, opt in enumerate(optimizers):
        groups = getattr(opt, "param_groups", None)
        if groups and isinstance(groups[0].get("lr"), int | float | torch.Tensor):
            lr = _scalar(groups[0]["lr"])
            if lr is not None:
                out["lr" if len(optimizers) == 1 else f"lr/{i}"] = lr
    return out


def _batch_size(batch: Any) -> int:
    """Samples in a batch: the length of its first tensor (0 when there is none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 0
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, list | tuple):
        for item in batch:
            n = _batch_size(item)
            if n:
                return n
    return 0
