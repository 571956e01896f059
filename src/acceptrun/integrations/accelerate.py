"""A plain Accelerate loop: ``save_state`` directories become acceptrun checkpoints.

::

    from acceptrun.integrations.accelerate import track              # acceptrun
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    tracker = track(accelerator)          # acceptrun: restores the newest verified state
    for step, batch in tracker.steps(loader, total_steps):           # acceptrun
        loss = model(**batch).loss
        accelerator.backward(loss); opt.step(); sched.step(); opt.zero_grad()
        tracker.log(step, loss=loss.item())
        if (step + 1) % 50 == 0:
            accelerator.save_state(f"ckpt/step_{step}")   # captured as the checkpoint of `step`

:func:`track` wraps this accelerator's ``save_state`` (this object only): every directory
it writes is captured into the run's checkpoint store as the checkpoint of the current
step (hashed, verified, retained by the spec, mirrored). On a restart it puts the newest
verified one back where it was written and calls ``load_state`` on it, so ``track`` must
come after ``prepare``. :meth:`Tracker.steps` yields ``(step, batch)`` from the step after
that checkpoint: it walks the epochs, skips the batches of the resumed epoch that were
already trained, writes step events (step time, data wait, total for the ETA), and turns
a graceful stop into a ``save_state`` of the finished step and exit 143.

Several processes (``resources.processes``, torchrun; ``accelerate launch`` is not
needed): every rank runs the same script. ``save_state`` writes on every rank (each its
RNG states), the ranks wait for each other, then rank 0 captures the directory; on a
restart rank 0 puts it back while the others wait, and every rank loads it. A stop is
decided by all ranks together at each step boundary (``run.should_stop``, one collective
a step), so they all save the same step and exit 143 together.

Exactness: ``load_state`` restores the model, optimizer, scheduler, scaler and the RNG
states as they were at the save, but not the data order of the epoch in progress. A
shuffling DataLoader draws its permutation (and its workers' base seed) from the global
torch RNG when its epoch begins; after a resume the RNG is the one of the save, mid-epoch,
so the epoch would be drawn anew. ``steps()`` keeps the torch RNG state of each epoch's
start in the checkpoint (``register_for_checkpointing``) and, on resume, draws the resumed
epoch's order from it, then puts the RNG back to the saved one: on CPU the resumed run is
bitwise the uninterrupted one (tests/test_integration_accelerate.py).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator  # type: ignore[import-untyped]

from acceptrun.errors import UserError
from acceptrun.integrations._base import FrameworkRun

__all__ = ["Tracker", "track"]


class _LoopState:
    """Where the loop is, saved by ``save_state`` beside the model (a custom object).

    With several processes the prepared loader shuffles with a generator of its own
    (Accelerate's ``synchronized_generator``, rank 0's state broadcast at each epoch's
    start), which ``save_state`` does not keep: its state at the epoch's start and at the
    save are kept here. Rank 0 writes this object; every rank loads it.
    """

    def __init__(self) -> None:
        self.step: int | None = None  # the step whose end the next save_state records
        self.epoch = 0
        self.epoch_rng: torch.Tensor | None = None  # torch RNG when the epoch began
        self.generator: torch.Generator | None = None  # the loader's, with several processes
        self.epoch_gen: torch.Tensor | None = None  # its state when the epoch began
        self.saved_gen: torch.Tensor | None = None  # its state at the save (loaded)

    def state_dict(self) -> dict[str, Any]:
        now = self.generator.get_state() if self.generator is not None else None
        return {
            "step": self.step, "epoch": self.epoch, "epoch_rng": self.epoch_rng,
            "epoch_gen": self.epoch_gen, "gen": now,
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.epoch, self.epoch_rng = state["step"], state["epoch"], state["epoch_rng"]
        self.epoch_gen, self.saved_gen = state.get("epoch_gen"), state.get("gen")


class Tracker:
    """An Accelerate loop attached to an acceptrun run. Create it with :func:`track`."""

    def __init__(
        self, accelerator: Accelerator, *, stop_dir: str | os.PathLike[str] | None
    ) -> None:
        if not getattr(accelerator, "_models", None):
            raise UserError(
                "track(accelerator) came before accelerator.prepare(model, ...): a restart "
                "loads the checkpoint into the prepared objects, so call "
                "model, opt, loader = accelerator.prepare(...) first, then track(accelerator)"
            )
        self.accelerator = accelerator
        self.fr = FrameworkRun.attach()
        self.run = self.fr.run
        self.start = 0  # the first step to run: 0, or the step after the restored checkpoint
        self.resumed_from: int | None = None
        self._loop = _LoopState()
        self._stop_dir = Path(stop_dir) if stop_dir is not None else None
        self._last_dir: Path | None = None
        self._saved_step: int | None = None  # the newest step save_state wrote, on every rank
        self._values: dict[str, float] = {}  # last loss and metrics: the checkpoint's metrics
        self._step_values: dict[str, float] = {}  # what log() gave for the step in flight
        self._in_steps = False
        accelerator.register_for_checkpointing(self._loop)
        self._save_state = accelerator.save_state
        accelerator.save_state = self._save_and_capture

    # ---- checkpoints ----------------------------------------------------------------------

    def _save_and_capture(self, output_dir: str | None = None, **kwargs: Any) -> Any:
        """``accelerator.save_state``, then capture what it wrote as the current step."""
        step = self._loop.step
        if step is None:
            raise UserError(
                "accelerator.save_state() was called before the first step of "
                "tracker.steps(); acceptrun names each checkpoint by the step it follows, so "
                "save inside the loop (after the step's work), or call tracker.steps() first"
            )
        location = self._save_state(output_dir, **kwargs)
        folder = Path(location if location is not None else output_dir or ".")
        self._last_dir = folder
        self._saved_step = step
        if self.accelerator.num_processes > 1:
            # Each rank writes its own RNG states into the directory, and save_state
            # returns without waiting for the others: capture once all have written.
            self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            self.fr.capture(
                step, {folder.name: folder}, metrics=self._values,
                meta={"framework": "accelerate", "epoch": self._loop.epoch},
            )  # fmt: skip
        else:
            self.fr.last_captured = step  # rank 0 captures it: the run's checkpoint of `step`
        return location

    def resume(self) -> int:
        """Restore the newest verified checkpoint (put back, then ``load_state``); the next step.

        Called by :func:`track`; 0 on a fresh start.
        """
        info = self.fr.resume_point()
        if info is None:
            return 0
        placed = self.fr.put_back(info)
        (folder,) = placed.values()
        self.accelerator.load_state(str(folder))
        if self._loop.step != info.step:
            raise UserError(
                f"{folder} holds the loop state of step {self._loop.step}, but acceptrun "
                f"stored it as step {info.step}; was it written by another script?"
            )
        self._last_dir = folder
        self._saved_step = info.step
        self.resumed_from = info.step
        self.start = info.step + 1
        return self.start

    # ---- the loop -------------------------------------------------------------------------

    def steps(self, loader: Any, total: int) -> Iterator[tuple[int, Any]]:
        """Yield ``(step, batch)`` for steps ``start .. total-1``, epoch after epoch.

        Each step is timed (data wait: the time to get its batch) and its event written
        when the body ends, with what :meth:`log` added. A stop request ends the loop at
        the next step boundary: ``save_state`` of the finished step (captured), then
        exit 143. ``loader`` is the prepared DataLoader; its length is an epoch. The
        boundary (:meth:`FrameworkRun.should_stop`) comes once before the first step
        and once after each step but the last, on every rank: a collective when there
        are several.
        """
        per_epoch = len(loader)
        if per_epoch == 0:
            raise UserError("the DataLoader given to tracker.steps() is empty; nothing to train on")
        step = self.start
        epoch, offset = divmod(step, per_epoch)
        # Mid-epoch: draw the epoch's order as it was first drawn. At an epoch's end the
        # next epoch starts from the restored RNG, as it did in the uninterrupted run.
        resuming = offset > 0 and self._loop.epoch == epoch and self._loop.epoch_rng is not None
        self._loop.generator = generator = getattr(loader, "synchronized_generator", None)
        if (
            self.resumed_from is not None
            and generator is not None
            and self._loop.saved_gen is not None
        ):
            generator.set_state(self._loop.saved_gen)  # where the uninterrupted run's was
        self._in_steps = True
        try:
            if self.fr.should_stop(step - 1):  # asked before the first step
                self._stop(step - 1)
            while step < total:
                batches = self._epoch_batches(loader, epoch, offset, resuming)
                resuming, offset = False, 0
                while step < total:
                    t0 = time.perf_counter()
                    self._loop.step = step - 1
                    try:
                        batch = next(batches)
                    except StopIteration:
                        break
                    wait = time.perf_counter() - t0
                    self._loop.step = step  # a save_state in the body records this step
                    yield step, batch
                    values = {"step_time": time.perf_counter() - t0, "data_wait": wait}
                    values.update(self._step_values)
                    self._step_values = {}
                    self.fr.log(step, **values, total_steps=total)
                    # The boundary, once a step on every rank (none after the last step:
                    # the loop ends there anyway).
                    if step + 1 < total and self.fr.should_stop(step):
                        self._stop(step)
                    step += 1
                epoch += 1
        finally:
            self._in_steps = False

    def _epoch_batches(self, loader: Any, epoch: int, offset: int, resuming: bool) -> Iterator[Any]:
        """The batches of ``epoch`` from ``offset`` on, in the order the epoch first had.

        The order is drawn from the torch RNG at the epoch's start (the sampler's seed,
        the workers' base seed), remembered for the checkpoints. When resuming, it is
        drawn from the remembered state and the RNG restored by ``load_state`` is put
        back after the first batch, where the uninterrupted run's RNG also was.
        """
        restored = None
        generator = self._loop.generator
        if resuming and self._loop.epoch_rng is not None:
            restored = torch.get_rng_state()
            torch.set_rng_state(self._loop.epoch_rng)
            if generator is not None and self._loop.epoch_gen is not None:
                generator.set_state(self._loop.epoch_gen)  # ends where it was at the save
        else:
            self._loop.epoch_rng = torch.get_rng_state()
            self._loop.epoch_gen = generator.get_state() if generator is not None else None
        self._loop.epoch = epoch
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        source = self.accelerator.skip_first_batches(loader, offset) if offset else loader
        it = iter(source)
        try:
            first = next(it)  # the sampler draws its order lazily, with the first batch
        except StopIteration:
            return
        finally:
            if restored is not None:
                torch.set_rng_state(restored)
        yield first
        yield from it

    def _stop(self, step: int) -> None:
        """Save the finished ``step`` (unless saved already), then exit 143."""
        if step >= 0 and self._saved_step != step:
            base = self._stop_dir or (self._last_dir.parent if self._last_dir else Path("."))
            self._loop.step = step
            self.accelerator.save_state(str(base / f"stopped-step-{step}"))
        self.fr.exit_stopped(step)

    # ---- events ---------------------------------------------------------------------------

    def log(self, step: int, **values: float) -> None:
        """Values for ``step`` (loss, samples, tokens, lr); inside :meth:`steps` they join its event."""
        if self._in_steps:
            self._values.update({k: float(v) for k, v in values.items()})
            self._step_values.update(values)
            return
        self.fr.log(step, **values)

    def metric(self, name: str, value: float, *, step: int | None = None) -> None:
        """A final or evaluation metric (acceptance thresholds read the last value)."""
        self.run.metric(name, value, step=step)
        with contextlib.suppress(TypeError, ValueError):
            self._values[name] = float(value)


def track(accelerator: Accelerator, *, stop_dir: str | os.PathLike[str] | None = None) -> Tracker:
    """Attach ``accelerator`` (after ``prepare``) to the run; restore the newest checkpoint.

    ``stop_dir`` is where a graceful stop saves when the stop falls between the script's
    own saves (default: beside the last ``save_state`` directory, or the current one).

    >>> tracker = track(accelerator)
    >>> tracker.start          # 0 on a fresh start, else the step after the checkpoint
    """
    tracker = Tracker(accelerator, stop_dir=stop_dir)
    tracker.resume()
    return tracker
