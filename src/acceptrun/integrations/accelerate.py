"""A plain Accelerate loop: ``save_state`` directories become acceptrun checkpoints.

Two ways to attach a loop. The loop as Accelerate's own examples write it (an epoch loop
around the prepared DataLoader, ``skip_first_batches`` on resume, ``completed_steps``
counted by the script, ``save_state(f"step_{completed_steps}")``, a ``break`` at
``max_train_steps``) keeps all of that and changes three lines::

    from acceptrun.integrations.accelerate import track                 # acceptrun
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    tracker = track(accelerator)                                         # acceptrun
    args.resume_from_checkpoint = tracker.resume_path or args.resume_from_checkpoint  # acceptrun
    if args.resume_from_checkpoint:   # the script's own resume: load_state, step_N, skip
        ...
    for epoch in range(starting_epoch, num_epochs):
        ...

Or the loop is :meth:`Tracker.steps`, which walks the epochs and skips itself::

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
come after ``prepare``; ``tracker.resume_path`` is that directory, for a script that
resumes itself.

Steps and their numbers. In the script's own loop the tracker counts optimizer steps
(one per ``sync_gradients``, as the example's ``completed_steps`` does): step ``n`` is the
``n``-th, 1 first, so ``step_100/`` is the checkpoint of step 100, as its name says. The
loss comes from ``accelerator.backward`` (the mean over the step's micro-batches), the
data wait from the prepared training loader, and the step event is written when the
optimizer step returns. A stop request is honoured at the next step boundary, where the
training loader is asked for the next batch: ``save_state`` of the finished step into a
directory named as the script names its own (``step_100`` -> ``step_120``), then exit
143. With :meth:`Tracker.steps` the steps are the ones it yields (0 first) and the
checkpoint of a ``save_state`` is that step.

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
so the epoch would be drawn anew. The tracker keeps the torch RNG state of each epoch's
start in the checkpoint (``register_for_checkpointing``) and, on resume, draws the resumed
epoch's order from it (the first ``skip_first_batches`` of a resumed script, or
``steps()``), then puts the RNG back to the saved one: on CPU the resumed run is bitwise
the uninterrupted one (tests/integration/test_integration_accelerate.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import warnings
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
        self,
        accelerator: Accelerator,
        *,
        stop_dir: str | os.PathLike[str] | None,
        total_steps: int | None = None,
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
        self.resume_path: str | None = None  # the restored directory, for the script's resume
        self.total_steps = total_steps  # for the ETA of the script's own loop (None: unknown)
        # The script's own loop (not steps()): what the hooks below count and measure.
        self.completed = 0  # optimizer steps finished: the script's completed_steps
        self._synced = 0  # the same, counted in steps() too (did the body step?)
        self._boundary = 0  # the step whose boundary was last passed (asked to stop)
        self._train: Any = None  # the prepared loader that fed the first optimizer step
        self._fetched_from: Any = None  # the loader of the newest batch
        self._wait = 0.0  # seconds in the training loader's next() since the last step
        self._last_end: float | None = None  # perf_counter at the last step's end
        self._loss_sum: Any = None  # the losses given to backward() since the last step
        self._loss_n = 0
        self._resume_skip = False  # the next skip_first_batches is the resumed epoch's
        self._begun = False  # a training epoch has started in this process
        accelerator.register_for_checkpointing(self._loop)
        self._save_state = accelerator.save_state
        accelerator.save_state = self._save_and_capture
        self._hook_loop()

    # ---- the script's own loop ------------------------------------------------------------

    def _hook_loop(self) -> None:
        """Follow a loop that is not :meth:`steps`: the optimizer, backward and the loaders.

        Only this accelerator's prepared objects are touched (their instance attributes,
        and each prepared DataLoader's class is swapped for a subclass whose ``__iter__``
        measures): nothing global changes.
        """
        accelerator = self.accelerator
        optimizers = list(getattr(accelerator, "_optimizers", []))
        if optimizers:  # one count per optimizer step of the first optimizer
            first = optimizers[0]
            original_step = first.step

            def step(*args: Any, **kwargs: Any) -> Any:
                out = original_step(*args, **kwargs)
                if accelerator.gradient_state.sync_gradients:
                    self._optimizer_stepped()
                return out

            first.step = step
        original_backward = accelerator.backward

        def backward(loss: Any, **kwargs: Any) -> Any:
            if not self._in_steps and isinstance(loss, torch.Tensor) and loss.numel() == 1:
                value = loss.detach().float()
                self._loss_sum = value if self._loss_sum is None else self._loss_sum + value
                self._loss_n += 1
            return original_backward(loss, **kwargs)

        accelerator.backward = backward
        original_skip = accelerator.skip_first_batches

        def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
            skipped = original_skip(dataloader, num_batches=num_batches)
            if self._in_steps:
                return skipped
            self._track_loader(skipped)
            skipped._acceptrun_origin = _origin(dataloader)  # the same training loader
            if self._resume_skip and num_batches > 0:  # the resumed epoch, mid-way
                skipped._acceptrun_resumed = True
            self._resume_skip = False
            return skipped

        accelerator.skip_first_batches = skip_first_batches
        for loader in getattr(accelerator, "_dataloaders", []):
            self._track_loader(loader)

    def _track_loader(self, loader: Any) -> None:
        """Swap ``loader``'s class for one that reports each epoch's start and each fetch."""
        cls = type(loader)
        if getattr(cls, "_acceptrun_tracked", False):
            loader._acceptrun_tracker = self
            return
        # Accelerate's loaders answer `__class__` with torch's DataLoader (a property,
        # for isinstance checks) and have no setter: set the real type through object's
        # own descriptor. `type(loader)` is the real class.
        _SET_CLASS(loader, _tracked_class(cls))
        loader._acceptrun_tracker = self

    def _epoch_begins(self, loader: Any) -> Any:
        """A tracked loader's ``__iter__`` starts: an epoch of training begins, perhaps.

        Remembers the torch RNG state of a training epoch's start (the checkpoints keep
        it). For the resumed epoch (the first ``skip_first_batches`` after a restart,
        mid-epoch) it draws the order from the saved state instead and returns the RNG
        state to put back after the first batch; else None.
        """
        if self._train is not None and _origin(loader) is not self._train:
            return None  # an evaluation loader
        generator = getattr(loader, "synchronized_generator", None)
        self._loop.generator = generator
        if getattr(loader, "_acceptrun_resumed", False) and self._loop.epoch_rng is not None:
            loader._acceptrun_resumed = False
            self._begun = True
            restored = torch.get_rng_state()
            torch.set_rng_state(self._loop.epoch_rng)
            if generator is not None and self._loop.epoch_gen is not None:
                generator.set_state(self._loop.epoch_gen)  # ends where it was at the save
            return restored
        if self._train is None:  # before the first step: the epoch this process starts in
            if not self._begun and self.resumed_from is not None:
                self._loop.epoch += 1  # resumed at an epoch's end
        elif self._begun:
            self._loop.epoch += 1
        self._begun = True
        self._loop.epoch_rng = torch.get_rng_state()
        self._loop.epoch_gen = generator.get_state() if generator is not None else None
        return None

    def _fetching(self, loader: Any) -> None:
        """The loop asks ``loader`` for a batch: a step boundary if a step ended since."""
        self._fetched_from = _origin(loader)
        if self._last_end is None:
            self._last_end = time.perf_counter()  # the first step starts with its batch
        if _origin(loader) is not self._train or self.completed <= self._boundary:
            return
        self._boundary = self.completed
        if self.fr.should_stop(self.completed):
            self._stop(self.completed)

    def _fetched(self, loader: Any, seconds: float) -> None:
        if not self._in_steps and (self._train is None or _origin(loader) is self._train):
            self._wait += seconds

    def _optimizer_stepped(self) -> None:
        """An optimizer step of the script's loop ended: count it and write its event."""
        self._synced += 1
        if self._in_steps:
            return
        if self._train is None:
            self._train = self._fetched_from
            if self._train is None and self.completed == self._boundary:  # the first step
                self._note(
                    "the first optimizer step's batch came from no DataLoader that "
                    "accelerator.prepare returned, so there is no step boundary to honour a "
                    "stop request at: a stop or preemption ends the attempt at the end of "
                    "its grace period, without a save. Pass the training DataLoader "
                    "through accelerator.prepare (or loop over tracker.steps())"
                )
        self.completed += 1
        step = self.completed
        self._loop.step = step  # a save_state from here on is the checkpoint of `step`
        now = time.perf_counter()
        values: dict[str, float] = {"data_wait": self._wait}
        if self._last_end is not None:
            values["step_time"] = now - self._last_end
        if self._loss_sum is not None and self._loss_n:
            # .item() waits for the step's loss: on a GPU, a sync point once a step.
            values["loss"] = float((self._loss_sum / self._loss_n).item())
            self._values["loss"] = values["loss"]
        self._loss_sum, self._loss_n, self._wait, self._last_end = None, 0, 0.0, now
        values.update(self._step_values)
        self._step_values = {}
        if self.total_steps:
            values["total_steps"] = self.total_steps
        self.fr.log(step, **values)

    # ---- checkpoints ----------------------------------------------------------------------

    def _save_and_capture(self, output_dir: str | None = None, **kwargs: Any) -> Any:
        """``accelerator.save_state``, then capture what it wrote as the current step."""
        step = self._loop.step
        if step is None:
            raise UserError(
                "accelerator.save_state() was called before the first optimizer step; "
                "acceptrun names each checkpoint by the step it follows, so save inside the "
                "loop, after the step's optimizer.step()"
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
        self.resume_path = str(folder)
        self.completed = self._boundary = info.step
        self._resume_skip = True
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
                    synced = self._synced
                    try:
                        yield step, batch
                    except GeneratorExit:
                        # The loop's own `break` after the step's work (the examples'
                        # `if completed_steps >= max_train_steps: break`): the step ran
                        # if the optimizer stepped in its body, so its event is written.
                        if self._synced > synced:
                            values = {"step_time": time.perf_counter() - t0, "data_wait": wait}
                            values.update(self._step_values)
                            self._step_values = {}
                            self.fr.log(step, **values, total_steps=total)
                        raise
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
            self._loop.step = step
            self.accelerator.save_state(str(self._stop_folder(step)))
        self.fr.exit_stopped(step)

    def _stop_folder(self, step: int) -> Path:
        """Where a stop saves ``step``: named as the script names its own saves.

        In the script's own loop a restart hands the directory to the script's resume
        code, which reads the step from its name (``step_120``): the newest save's name
        with its step replaced, when its name holds its step once. Else, and in
        :meth:`steps`, ``stopped-step-<step>`` beside the newest save (or in
        ``stop_dir``, or here).
        """
        base = self._stop_dir or (self._last_dir.parent if self._last_dir else Path("."))
        last, saved = self._last_dir, self._saved_step
        if not self._in_steps and self._stop_dir is None and last is not None and saved is not None:
            numbers = re.findall(r"\d+", last.name)
            if numbers.count(str(saved)) == 1 and len(numbers) == 1:
                return last.parent / last.name.replace(str(saved), str(step))
        return base / f"stopped-step-{step}"

    # ---- events ---------------------------------------------------------------------------

    def _note(self, text: str) -> None:
        """Say what the tracker cannot do for this loop: a warning and a resume_note event."""
        warnings.warn(f"acceptrun: {text}", stacklevel=3)
        if self.run.rank == 0:
            self.run.record.event("resume_note", attempt=self.run.attempt, note=text)

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


def track(
    accelerator: Accelerator,
    *,
    stop_dir: str | os.PathLike[str] | None = None,
    total_steps: int | None = None,
) -> Tracker:
    """Attach ``accelerator`` (after ``prepare``) to the run; restore the newest checkpoint.

    ``stop_dir`` is where a graceful stop saves when the stop falls between the script's
    own saves (default: named as the script's newest save, beside it; or the current
    directory). ``total_steps`` gives the script's own loop an ETA (``steps()`` has its
    ``total``).

    >>> tracker = track(accelerator)
    >>> tracker.start          # 0 on a fresh start, else the step after the checkpoint
    >>> tracker.resume_path    # None on a fresh start, else the restored directory
    """
    tracker = Tracker(accelerator, stop_dir=stop_dir, total_steps=total_steps)
    tracker.resume()
    return tracker


_TRACKED: dict[type, type] = {}
_SET_CLASS = object.__dict__["__class__"].__set__


def _tracked_class(cls: type) -> type:
    """A subclass of the prepared loader's class whose ``__iter__`` reports to the tracker.

    Each epoch's start (:meth:`Tracker._epoch_begins`) and each fetch (the step
    boundary before it, and its data wait); a loader whose tracker is inside
    :meth:`Tracker.steps` iterates as its class does.
    """
    if cls in _TRACKED:
        return _TRACKED[cls]

    def __iter__(self: Any) -> Iterator[Any]:
        tracker: Tracker | None = getattr(self, "_acceptrun_tracker", None)
        if tracker is None or tracker._in_steps:
            yield from cls.__iter__(self)  # type: ignore[attr-defined]
            return
        tracker._fetching(self)  # the boundary before an epoch's first batch comes first
        restore = tracker._epoch_begins(self)
        batches = cls.__iter__(self)  # type: ignore[attr-defined]
        while True:
            tracker._fetching(self)
            t0 = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                if restore is not None:  # the resumed epoch's order is drawn: RNG back
                    torch.set_rng_state(restore)
                    restore = None
            tracker._fetched(self, time.perf_counter() - t0)
            yield batch

    tracked = type(cls.__name__, (cls,), {"__iter__": __iter__, "_acceptrun_tracked": True})
    tracked.__module__ = cls.__module__
    _TRACKED[cls] = tracked
    return tracked


def _origin(loader: Any) -> Any:
    """The prepared loader that ``loader`` was made from (``skip_first_batches``), or itself."""
    return getattr(loader, "_acceptrun_origin", loader)
