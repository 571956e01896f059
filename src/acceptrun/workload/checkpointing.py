"""Checkpoint glue: register state, restore it on resume, save on the spec's interval.

The saving itself (async, atomic, verified) is :mod:`acceptrun.checkpoint`; this part of
the run decides what to save and when, and which checkpoint to resume from. A restore
drill (``ACCEPTRUN_DRILL``) restores, runs one step and records the result.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from acceptrun.errors import (
    AcceptrunError,
    AcceptrunKeyError,
    AcceptrunRuntimeError,
    AcceptrunValueError,
)
from acceptrun.workload import standby
from acceptrun.workload.base import RunBase
from acceptrun.workload.contract import DRILL_SCRATCH_PREFIX

__all__ = ["Checkpointing"]

_TAIL = 1 << 18  # bytes of events.jsonl read back for a resume's mirror_fetch event

# run.log values that count the work a step did (throughput), not a metric of the model.
COUNTERS = frozenset({"samples", "tokens", "total_steps"})


class Checkpointing(RunBase):
    """Restore, checkpoint and restore drills (a part of :class:`~acceptrun.workload.run.Run`)."""

    _drill_scratch: Any = None  # a restore drill's scratch CheckpointStore, made on first use
    _memtier: Any = None  # checkpoint.memtier.MemoryTier, made on first use (when on)
    _memtier_checked = False
    _durable_step: int | None = None  # the newest durable checkpoint the state builds on
    _memory_meta: dict[str, Any] | None = None

    def _store(self) -> Any:
        """The run's own store (the supervisor's ACCEPTRUN_CHECKPOINT_DIR, else the record's),
        its owner checked; rank 0 of a standalone run claims it on first use."""
        from acceptrun.checkpoint.owner import open_run_store

        return open_run_store(
            self.record, self.spec, root=self.checkpoint_dir, on_event=self._lifecycle_event,
            claim=self.rank == 0 and not self.drill,
        )  # fmt: skip

    def checkpoint_store(self) -> Any:
        """This run's :class:`~acceptrun.checkpoint.CheckpointStore`: its directory, the spec's
        retention, commits recorded in events.jsonl. For sharded (FSDP2) checkpoints::

            from acceptrun.checkpoint import sharded
            sharded.save(run.checkpoint_store(), step, {"model": msd, "optim": osd})
            info = sharded.load(run.checkpoint_store(), state)   # None on a fresh start

        With ``checkpoint.mirror`` in the spec, what this store commits on rank 0 is
        mirrored as ``run.checkpoint()``'s saves are: uploaded in the background, deleted
        from the mirror when retention deletes it here, drained at exit.

        In a restore drill it is a scratch store instead (:meth:`_drill_store`): loads
        read the run's checkpoints, saves never reach them.
        """
        if self.drill:
            return self._drill_store()
        store = self._store()
        store.on_sharded_load = self._sharded_loaded  # a restore, as run.restore's (sharded.load)
        if self.spec.checkpoint.mirror and not self.drill:
            mirror = self._run_mirror()
            store.subscribe(mirror.follow if mirror is not None else self._not_mirrored)
        return store

    def _drill_store(self) -> Any:
        """A restore drill's store for ``sharded.save``/``load``: a scratch directory.

        A drill must never change the run's checkpoints, yet a sharded script saves
        through the store as it always does. So its saves go through the whole protocol
        (staging, hashes, manifest, commit) into ``<run>/.drill-checkpoints-<launch>``,
        which every rank of this launch names alike (torchrun's run id) and the drill
        removes when the workload has exited; no event of it reaches the run's record.
        Loads read the run's own checkpoints (``restore_source``, never quarantining): the
        step the drill verified (``restore_step``, from ``ACCEPTRUN_RESUME_FROM``), and
        each rank's load is reported to :meth:`_sharded_loaded`, the drill's proof of the
        restore.
        """
        if self._drill_scratch is None:
            from acceptrun.checkpoint.owner import open_run_store
            from acceptrun.checkpoint.store import CheckpointStore

            ck = self.spec.checkpoint
            launch = os.environ.get("TORCHELASTIC_RUN_ID") or f"pid{os.getpid()}"
            name = DRILL_SCRATCH_PREFIX + re.sub(r"[^A-Za-z0-9_.-]", "_", launch)
            scratch: Any = CheckpointStore(self.run_dir / name, keep_last=ck.keep_last)
            scratch.restore_source = open_run_store(  # read only
                self.record, self.spec, root=self.checkpoint_dir, retention=False
            )
            resume = Path(self.resume_from or "").name
            scratch.restore_step = (  # the checkpoint the drill verified, as run.restore's
                int(resume.split("-", 1)[1]) if re.fullmatch(r"step-\d+", resume) else None
            )
            scratch.on_sharded_load = self._sharded_loaded
            scratch.drill_saves = []  # the steps the drill's own saves committed (rank 0)
            scratch.subscribe(
                lambda kind, fields: (
                    scratch.drill_saves.append(fields.get("step"))
                    if kind == "checkpoint_commit"
                    else None
                )
            )
            self._drill_scratch = scratch
        return self._drill_scratch

    def _sharded_loaded(self, info: Any, seconds: float, rank: int, world: int) -> None:
        """``sharded.load`` filled this rank's state from the run's checkpoint ``info``.

        The run's restore, as :meth:`restore`'s: what a drill checks, and (rank 0, not in a
        drill) a ``restored`` event with the step and the seconds the load took.
        """
        self._restored = {
            "step": info.step, "path": str(info.path), "seconds": seconds,
            "how": f"sharded.load on rank {rank} of {world}",
        }  # fmt: skip
        self._last_saved_step = info.step
        if not self.drill and self.rank == 0:
            self.record.event(
                "restored", sync=True, attempt=self.attempt, step=info.step,
                path=str(info.path), seconds=round(seconds, 4), source="sharded",
            )  # fmt: skip

    def _run_mirror(self) -> Any:
        """The run's one Mirror of ``checkpoint.mirror`` (rank 0 only), started on first use.

        Shared by the Checkpointer and the stores of :meth:`checkpoint_store`, so that one
        thread uploads and one state file (``mirror.json``) tracks every step.
        """
        if self._mirror is None and self.spec.checkpoint.mirror and self.rank == 0:
            from acceptrun.checkpoint.mirror import Mirror
            from acceptrun.checkpoint.owner import mirror_root, owner_of

            self._mirror = Mirror(
                str(mirror_root(self.record, self.spec)),
                owner=owner_of(self.record),
                state_path=self.record.file("mirror.json"),
                on_event=self._event_sink,
            )
            self._mirror.start()
        return self._mirror

    def _not_mirrored(self, kind: str, fields: dict[str, Any]) -> None:
        """A checkpoint committed on a rank other than 0, which runs no mirror: say so."""
        if kind != "checkpoint_commit":
            return
        self._event_sink(
            "mirror_failed",
            {
                "step": fields.get("step"),
                "state": "not_mirrored",
                "reason": (
                    f"checkpoint.mirror is set but step {fields.get('step')} was committed on "
                    f"rank {self.rank}, and only rank 0 runs the mirror: pass sharded.save a "
                    "process_group whose first rank is global rank 0 (or none, the default)"
                ),
            },
        )

    def _close_checkpoints(self) -> None:
        """At exit: the last save committed, then the mirror drained (up to 60 s) or its lag
        recorded (a ``mirror_behind`` event). A workload dying of an uncaught exception
        waits for the mirror only while it is healthy: an outage, or a disk too full for
        the mirror too, would otherwise hold the dying process past the hang window (and
        get it named a hang); its next attempt uploads what is still pending."""
        mirror, self._mirror = self._mirror, None
        checkpointer = self._checkpointer
        failing = getattr(self, "_exception", None) is not None
        self._settle_sharded_save()  # its commit is then mirrored below
        try:
            if checkpointer is not None:
                checkpointer.close(failing=failing)  # drains and closes the mirror it was given
            if self._memtier is not None:
                self._memtier.close()  # the last memory save, and its figures recorded
        finally:
            if mirror is not None and (checkpointer is None or checkpointer.mirror is not mirror):
                mirror.drain_and_close(60.0, while_healthy=failing)

    def _close_checkpoints_once(self) -> str | None:
        """:meth:`_close_checkpoints` the first time it is asked for (the interpreter's exit
        hook, else :meth:`finish`); the workload's error status when it failed, else None."""
        if not self._checkpoints_closed and (
            self._checkpointer is not None or self._mirror is not None or self._memtier
        ):
            self._checkpoints_closed = True
            try:
                self._close_checkpoints()  # the last save, then the mirror drained
            except Exception as exc:  # the exit status still gets recorded
                self._checkpoints_error = f"error: {type(exc).__name__}: {exc}"
        return self._checkpoints_error

    def _settle_sharded_save(self) -> None:
        """A ``sharded.async_save`` still in flight on this run's directory ends first."""
        sharded = sys.modules.get("acceptrun.checkpoint.sharded")
        if sharded is None:  # never imported: no sharded save was made
            return
        with contextlib.suppress(AcceptrunError):  # recorded: a checkpoint_failed event
            sharded.wait(self._store())

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

        ::

            start = run.restore(model=model, optimizer=opt, scheduler=sched)
            start = run.restore(model=ddp.module, optimizer=opt, per_rank={"loader": loader})
            start = run.restore(model=model, history=history, best_loss=float("inf"))
            best_loss = run.restored.get("best_loss", float("inf"))   # history: in place
        """
        standby.wait_for_go(self)  # a standby attempt waits here for its turn
        both = sorted(set(objects) & set(per_rank or {}))
        if both:
            raise AcceptrunValueError(
                f"{both}: a name is either shared (keyword) or in per_rank, not both"
            )
        self._objects = dict(objects)
        self._per_rank = dict(per_rank or {})
        if self.ranks.distributed:
            self._rank_group()  # the collectives, while every rank is at the same point
        resume = self.resume_from
        tier = self._memory_tier()
        if not resume and tier is None:
            return 0
        store = self._store()
        self._durable_step = _step_of(resume)
        memory = None
        if tier is not None:  # the newest verified source: memory, then disk
            step, memory = self._restore_from_memory(tier, map_location)
            if step is not None:
                return step + 1
        if not resume:
            return 0
        path, loaded, seconds = self._load_resume(store, resume, map_location)
        source = "mirror" if self._fetched_from_mirror(path) else "disk"
        return self._keep_restored(store, path, loaded, seconds, source, memory) + 1

    def _memory_tier(self) -> Any:
        """The run's :class:`~acceptrun.checkpoint.memtier.MemoryTier`, or None when it is
        off: no ``checkpoint.memory_every``, no directory from the supervisor (a standalone
        run), a restore drill, or a run of several processes."""
        if not self._memtier_checked:
            self._memtier_checked = True
            from acceptrun.checkpoint.memtier import ENV_MEMORY_DIR, MemoryTier

            root = os.environ.get(ENV_MEMORY_DIR)
            on = self.spec.checkpoint.memory_every is not None and bool(root)
            if on and not self.drill and not self.ranks.distributed:
                self._memtier = MemoryTier(
                    Path(str(root)), on_event=self._event_sink,
                    overlap=self.spec.checkpoint.staging == "overlap",
                )  # fmt: skip
        return self._memtier

    def _restore_from_memory(
        self, tier: Any, map_location: str | None
    ) -> tuple[int | None, str | None]:
        """Load the memory tier's copy when it is the newest verified source: its step (None
        when the durable store is read instead) and why copies were passed over."""
        from acceptrun.checkpoint.restore import load_into
        from acceptrun.checkpoint.state import TENSORS
        from acceptrun.checkpoint.tensorfile import TensorsHashMismatch

        found = tier.candidate(self._durable_step, defer=TENSORS)
        rejected = list(found.rejected)
        if found.info is not None:
            t0 = time.perf_counter()
            objects = {**self._objects, **self._per_rank}
            try:  # the tensors hashed as they load: a mismatch changes nothing
                loaded = load_into(
                    found.info.path, objects, device=map_location, expect=found.expect
                )
            except TensorsHashMismatch as exc:
                tier.drop(found.info)
                rejected.append(f"memory copy of step {found.info.step} failed verification: {exc}")
            else:
                seconds = time.perf_counter() - t0
                step = self._keep_restored(tier.store, found.info.path, loaded, seconds, "memory")
                return step, None
        return None, "; ".join(rejected) or None

    def _fetched_from_mirror(self, path: Path) -> bool:
        """Whether a resume fetched ``path`` back from the mirror for this attempt (its
        ``mirror_fetch`` event, among the record's last events: no whole read of a long log)."""
        try:
            with open(self.record.events_path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - _TAIL))
                tail = f.read()
        except OSError:
            return False
        for line in tail.splitlines():
            if b'"mirror_fetch"' in line:
                with contextlib.suppress(ValueError):
                    ev = json.loads(line)
                    if ev.get("attempt") == self.attempt and ev.get("path") == str(path):
                        return True
        return False

    def _load_resume(
        self, store: Any, resume: str, map_location: str | None
    ) -> tuple[Path, dict[str, Any], float]:
        """Verify the checkpoint ``resume`` names and load it into the registered objects.

        Returns the path loaded (a damaged one is set aside for the newest that verifies),
        what it held and the seconds the load took.
        """
        from acceptrun.checkpoint.restore import load_into, load_ranked
        from acceptrun.checkpoint.state import TENSORS
        from acceptrun.checkpoint.tensorfile import TensorsHashMismatch

        expect = None
        if self.ranks.distributed:
            path = self._agreed_resume_path(store, resume)
        else:
            # The tensors are hashed as they are loaded: the bytes are read once.
            path, expect = self._verified_resume_path(store, resume, defer=TENSORS)
        t0 = time.perf_counter()
        if self.ranks.distributed:
            loaded = load_ranked(
                path, self._objects, self._per_rank, rank=self.rank,
                world_size=self.world_size, device=map_location,
            )  # fmt: skip
        else:
            objects = {**self._objects, **self._per_rank}
            try:
                loaded = load_into(path, objects, device=map_location, expect=expect)
            except TensorsHashMismatch:
                # Damaged since it was written: nothing was loaded. The full check sets it
                # aside (a checkpoint_quarantine event) and finds the newest one that verifies.
                path, _ = self._verified_resume_path(store, str(path))
                loaded = load_into(path, objects, device=map_location)
        return path, loaded, time.perf_counter() - t0

    def _keep_restored(
        self,
        store: Any,
        path: Path,
        loaded: dict[str, Any],
        seconds: float,
        source: str,
        memory: str | None = None,
    ) -> int:
        """Put the loaded plain values back, note the restore (a ``restored`` event with its
        ``source``, and ``memory``: why the memory tier's copies were passed over); its step."""
        from acceptrun.checkpoint.restore import restore_values

        values = restore_values({**self._objects, **self._per_rank}, loaded["values"])
        for name, value in values.items():  # the next checkpoint saves the restored value
            (self._per_rank if name in self._per_rank else self._objects)[name] = value
        self._values = values
        manifest = store.get(int(path.name.split("-", 1)[1]))
        step = manifest.step if manifest is not None else int(path.name.split("-", 1)[1])
        self._restored = {"step": step, "path": str(path), "seconds": seconds, "source": source}
        self._last_saved_step = step
        if not self.drill and self.rank == 0:
            extra: dict[str, Any] = {} if memory is None else {"memory": memory}
            self.record.event(
                "restored", sync=True, attempt=self.attempt, step=step, path=str(path),
                seconds=round(self._restored["seconds"], 4), notes=loaded.get("notes", []),
                source=source, **extra,
            )  # fmt: skip
        return step

    @property
    def restored(self) -> dict[str, Any]:
        """The plain values :meth:`restore` loaded from a checkpoint; empty on a fresh start.

        Mutable ones are the very objects that were registered, now filled in place.

        ::

            epoch = run.restored.get("epoch", 0)
        """
        return dict(self._values)

    def state(self, name: str) -> Any:
        """The current value of the plain value registered as ``name`` (restored, or as given).

        ::

            epoch = run.state("epoch")
        """
        registered = {**self._objects, **self._per_rank}
        if name not in registered:
            raise AcceptrunKeyError(
                f"{name!r} is not registered; register it with run.restore({name}=...) "
                f"(registered: {sorted(registered)})"
            )
        return registered[name]

    def update_state(self, **values: Any) -> None:
        """Replace registered plain values; the next checkpoint saves the new ones.

        For immutable values (an epoch counter, the best loss so far) that the script
        rebinds: the checkpoint holds what was last given here, or to :meth:`restore`.

        ::

            run.update_state(epoch=epoch, best_loss=best_loss)
        """

        def stateful(obj: Any) -> bool:  # checkpoint.state's test, without importing torch
            return callable(getattr(obj, "state_dict", None)) and callable(
                getattr(obj, "load_state_dict", None)
            )

        for name, value in values.items():
            target = self._per_rank if name in self._per_rank else self._objects
            if name not in target:
                raise AcceptrunKeyError(
                    f"{name!r} is not registered; register it first with "
                    f"run.restore({name}=...) so that it is saved and restored"
                )
            if stateful(target[name]) or stateful(value):
                raise AcceptrunValueError(
                    f"{name!r} is an object with state_dict(); it is saved from the object "
                    "itself, update_state() is for plain values (numbers, dicts, lists)"
                )
            target[name] = value

    def _agreed_resume_path(self, store: Any, resume: str) -> Path:
        """Rank 0 verifies the checkpoint (one re-read, not one per rank); all load it."""
        group = self._rank_group()
        if group is None:  # no torch.distributed: each rank verifies for itself
            return self._verified_resume_path(store, resume)[0]
        chosen: tuple[str | None, str | None] = (None, None)
        if self.rank == 0:
            try:
                chosen = (str(self._verified_resume_path(store, resume)[0]), None)
            except Exception as exc:  # every rank raises it, not only rank 0
                chosen = (None, str(exc))
        path, error = group.broadcast(chosen)
        if error is not None or path is None:
            raise AcceptrunRuntimeError(error or "rank 0 found no checkpoint to resume from")
        return Path(path)

    def _verified_resume_path(
        self, store: Any, resume: str, *, defer: str | None = None
    ) -> tuple[Path, str | None]:
        """``resume`` if it verifies, else the newest checkpoint that does; with ``defer``
        (a file name) that file is left to the loader to hash as it reads it, and its
        manifest hash comes back beside the path (None when everything was hashed here)."""
        path = Path(resume)
        step_dir = int(path.name.split("-", 1)[1]) if path.name.startswith("step-") else None
        result = (
            store.verify(step_dir, defer=[defer] if defer else [])
            if step_dir is not None and path.parent == store.root
            else None
        )
        if result is not None and result.ok:
            info = store.get(step_dir) if result.deferred else None
            entry = info.files.get(defer) if info is not None and defer else None
            return path, (str(entry["hash"]) if entry else None)
        info = store.latest_verified()
        if info is None:
            raise AcceptrunRuntimeError(
                f"cannot resume: {resume} failed verification and no older checkpoint in "
                f"{store.root} verifies; see the quarantine/ folder there"
            )
        return info.path, None

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
            raise AcceptrunRuntimeError(
                "nothing to checkpoint: call run.restore(model=..., optimizer=...) first"
            )
        if self.ranks.distributed and self._rank_group() is None:
            raise AcceptrunRuntimeError(
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

        Counts of work (``samples``, ``tokens``: what the step processed, for throughput)
        are no metric of the state saved, and are left out.

        Inside :meth:`steps` a checkpoint of the current step is taken before its event
        is written, so its values are still pending.
        """
        values = (
            self._pending
            if self._in_steps and self._phase[1] == step
            else self._last_values
            if self._last_values_step == step
            else {}
        )
        return {
            k: v for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and k not in COUNTERS
        }  # fmt: skip

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
        if due and self._last_saved_step != step:
            self.checkpoint(step, block=self._stop_requested)
            return True
        if self._last_saved_step != step and self._memory_tier() is not None:
            self._memory_save(step)
        return False

    def _memory_save(self, step: int) -> None:
        """Save to the memory tier when ``checkpoint.memory_every`` says so (rank 0 of one).

        A step where a durable save falls too is not saved here: the durable save's commit
        is copied in (:meth:`_durable_committed`), so the loop copies the state once.
        """
        every = self.spec.checkpoint.memory_every
        tier = self._memtier
        if every is None or (step + 1) % every or tier is None or tier.off:
            return
        if not self._objects and not self._per_rank:
            return  # nothing registered: run.checkpoint() would say so
        if self._memory_meta is None:
            prov = self.record.read_json("provenance.json") or {}
            self._memory_meta = {
                "run_id": self.run_id, "attempt": self.attempt,
                "spec_hash": self.record.state.get("spec_hash") or self.spec.hash,
                "provenance_hash": prov.get("hashes", {}).get("all"),
            }  # fmt: skip
        values = {k: float(v) for k, v in self._values_of(step).items()}
        tier.save(
            step, {**self._objects, **self._per_rank}, durable_step=self._durable_step,
            metrics=values, meta=self._memory_meta,
        )  # fmt: skip

    def _durable_committed(self, kind: str, fields: dict[str, Any]) -> None:
        """A durable checkpoint committed (the saver's thread): the newest the state builds
        on, and, with the memory tier on, copied in as its newest copy."""
        if kind != "checkpoint_commit" or not isinstance(fields.get("step"), int):
            return
        step = int(fields["step"])
        self._durable_step = step
        tier = self._memtier
        if tier is not None and self._checkpointer is not None:
            info = self._checkpointer.store.get(step)
            if info is not None:
                tier.adopt(info, durable_step=step)

    def _make_checkpointer(self) -> Any:
        from acceptrun.checkpoint.saver import Checkpointer

        store = self._store()
        if self.rank == 0:  # rank 0 owns the root: the others write inside its saves
            store.remove_stale_staging()
        store.subscribe(self._durable_committed)  # the memory tier's base, and its copy
        mirror = self._run_mirror()
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
            overlap=self.spec.checkpoint.staging == "overlap",
        )  # fmt: skip

    def _finish_drill(self, step: int, seconds: float) -> None:
        restored = self._restored or {}
        ok = bool(restored) and all(
            isinstance(v, int | float) and v == v and abs(v) != float("inf")
            for v in self._last_values.values()
        )
        values = (
            ", ".join(f"{k}={v:.6g}" for k, v in self._last_values.items()) or "no values logged"
        )
        how = f" with {restored['how']}" if restored.get("how") else ""
        evidence = (
            f"restored step {restored.get('step')}{how} in {restored.get('seconds', 0):.2f}s "
            f"and ran step {step} ({values})"
            if restored
            else "nothing was restored: the workload never called run.restore() or "
            "sharded.load(run.checkpoint_store(), ...), or had no checkpoint"
        )
        scratch = self._drill_scratch
        if scratch is not None and scratch.drill_saves:
            evidence += (
                f"; its sharded save of step {', '.join(map(str, scratch.drill_saves))} "
                "committed to a scratch store, not to the run's checkpoints"
            )
        self.record.event(
            "drill", sync=True, drill=self.drill, ok=ok, step=step, evidence=evidence,
            **self._rank_field(),
        )  # fmt: skip
        raise SystemExit(0 if ok else 1)


def _step_of(resume: str | None) -> int | None:
    """The step of a checkpoint directory's name (``.../step-<N>``), else None."""
    name = Path(resume or "").name
    return int(name.split("-", 1)[1]) if re.fullmatch(r"step-\d+", name) else None
