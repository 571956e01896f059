"""The Lightning callback's training loader: data order and position that resume exactly.

:func:`wrap_process_dataloader` makes the training ``DataLoader`` resumable where the
strategy hands it to the loop (:class:`ResumableLoader`); :func:`capture_rng` and
:func:`apply_rng` save and put back the RNG states in types that
``torch.load(weights_only=True)`` accepts. Used by
:class:`~acceptrun.integrations.lightning.AcceptrunCallback` only.
"""

from __future__ import annotations

import contextlib
import random
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, IterableDataset

if TYPE_CHECKING:
    from acceptrun.integrations.lightning import AcceptrunCallback

__all__ = [
    "LOADER_FORMAT",
    "ResumableLoader",
    "apply_rng",
    "capture_rng",
    "wrap_process_dataloader",
]

LOADER_FORMAT = "acceptrun.lightning.loader/1"


def wrap_process_dataloader(strategy: Any, callback: AcceptrunCallback) -> None:
    """Make the training DataLoader resumable where the strategy hands it to the loop."""
    if getattr(strategy.process_dataloader, "_acceptrun", False):
        return
    original = strategy.process_dataloader
    ref = weakref.ref(callback)

    def process_dataloader(dataloader: Any) -> Any:
        dataloader = original(dataloader)
        me = ref()
        trainer = me._trainer if me is not None else None
        if me is None or trainer is None or not trainer.training or trainer.sanity_checking:
            return dataloader
        return ResumableLoader.wrap(dataloader, me)

    process_dataloader._acceptrun = True  # type: ignore[attr-defined]
    strategy.process_dataloader = process_dataloader


class ResumableLoader:
    """Data order and position of a plain ``DataLoader`` through a save and a resume.

    Lightning stores the state of a training loader that has ``state_dict()`` and
    ``load_state_dict()`` in its checkpoint and loads it before it creates the
    iterator; a plain ``DataLoader`` has neither, and a resumed epoch restarts with a
    new shuffle (Lightning warns about this). The loader's class is swapped, for the fit
    only, for a subclass with those two methods; iteration is unchanged except that:

    * the RNG states (global, and the loader's and sampler's generators) are recorded just
      before each epoch's iterator is created and just before its sampler first draws;
    * a save records them and the number of batches handed to Lightning;
    * the first iterator after a mid-epoch resume is created under the recorded states
      and its sampler skips the delivered batches (indices only, no data loaded), which
      reproduces the epoch's order; then the RNG states of the save are put back.

    Worker processes restart with the iterator: randomness inside workers (random
    augmentation) does not continue where it stopped.
    """

    def __init__(self, loader: DataLoader[Any], callback: AcceptrunCallback) -> None:
        self.loader = loader
        self.callback = weakref.ref(callback)
        self.delivered = 0
        self.rng_before_iter: dict[str, Any] | None = None
        self.rng_before_sampler: dict[str, Any] | None = None
        self.plan: dict[str, Any] | None = None  # loaded state, for the next iterator
        self.replay: dict[str, Any] | None = None  # for the sampler's first draw
        self.original_class = type(loader)

    @classmethod
    def wrap(cls, loader: Any, callback: AcceptrunCallback) -> Any:
        if not isinstance(loader, DataLoader):
            callback._note(
                f"the training loader is a {type(loader).__name__}, not a DataLoader: "
                "data order after a mid-epoch resume is its own (state_dict() if it has one)"
            )
            return loader
        if isinstance(getattr(loader, "_acceptrun", None), ResumableLoader):
            return loader
        if callable(getattr(loader, "state_dict", None)):
            return loader  # stateful already (torchdata's StatefulDataLoader): Lightning saves it
        if isinstance(loader.dataset, IterableDataset):
            callback._note(
                "the training data is an IterableDataset: a mid-epoch resume restarts its "
                "stream (give it state_dict()/load_state_dict() to continue it)"
            )
            return loader
        state = cls(loader, callback)
        loader._acceptrun = state
        loader.__class__ = _resumable_class(type(loader))
        callback._loaders.append(state)
        return loader

    def unwrap(self) -> None:
        """The loader's own class again (after the fit); its iteration never changed."""
        with contextlib.suppress(TypeError):
            self.loader.__class__ = self.original_class

    def generators(self, prefix: str) -> dict[str, torch.Generator]:
        """The loader's own generator (worker seeds): part of the RNG saved at each save."""
        gen = self.loader.generator
        return {prefix: gen} if isinstance(gen, torch.Generator) else {}

    def sampler_generators(self) -> dict[str, torch.Generator]:
        out = {}
        sampler = self.loader.sampler
        batch_sampler = self.loader.batch_sampler
        for key, obj in (("sampler", sampler), ("batch_sampler", batch_sampler)):
            gen = getattr(obj, "generator", None)
            if isinstance(gen, torch.Generator):
                out[key] = gen
        inner = getattr(batch_sampler, "sampler", None)
        gen = getattr(inner, "generator", None)
        if inner is not sampler and isinstance(gen, torch.Generator):
            out["batch_sampler.sampler"] = gen
        return out

    def state_dict(self) -> dict[str, Any]:
        me = self.callback()
        trainer = me._trainer if me is not None else None
        epoch_batches = float(trainer.num_training_batches) if trainer is not None else float("inf")
        return {
            "format": LOADER_FORMAT,
            "delivered": self.delivered,
            "epoch_batches": epoch_batches,
            "rng_before_iter": self.rng_before_iter,
            "rng_before_sampler": self.rng_before_sampler,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != LOADER_FORMAT:
            me = self.callback()
            if me is not None:
                me._note("the checkpoint's loader state is not acceptrun's: data order restarts")
            return
        self.plan = dict(state)

    def new_iterator(self, create: Any) -> Iterator[Any]:
        """``create()`` makes the DataLoader's iterator; this wraps it (see the class doc).

        The RNG states of the save are put back at the first batch the iterator hands
        over, not before: between the two, a resumed Lightning may create a validation
        iterator (to skip a validation the save came before) that draws from them.
        """
        plan, self.plan = self.plan, None
        me = self.callback()
        notes: list[str] = []
        at_first_batch: Any = None  # "saved": the save's states; a dict: these states
        mid_epoch = (
            plan is not None
            and plan["rng_before_iter"] is not None
            and plan["delivered"] < plan["epoch_batches"]
        )
        if mid_epoch:
            assert plan is not None
            notes += apply_rng(plan["rng_before_iter"], self.generators("loader"))
            self.replay = {"rng": plan["rng_before_sampler"], "skip": int(plan["delivered"])}
        elif plan is not None and me is not None:
            me._apply_resume_rng()  # a new epoch: its shuffle draws from the saved states
        self.rng_before_iter = capture_rng(self.generators("loader"))
        self.rng_before_sampler = None
        self.delivered = 0
        iterator = create()
        if mid_epoch and plan is not None:
            tap = getattr(iterator, "_sampler_iter", None)
            if isinstance(tap, _TapIter):
                tap.prime()  # skip now, under the recorded states (one process: it is lazy)
            elif self.replay is not None:
                notes.append("the loader's iterator has no sampler to skip: data order differs")
            self.delivered = int(plan["delivered"])
            at_first_batch = "saved"
        elif plan is not None:
            at_first_batch = capture_rng(self.generators("loader"))  # as created
        elif me is not None and me._resume_rng is not None and not me._resume_rng_applied:
            notes.append("the checkpoint holds no loader state: this epoch's order is new")
            at_first_batch = "saved"
        if me is not None:
            me._note_all(notes)
        return _Counting(iterator, self, at_first_batch)

    def first_batch(self, states: Any) -> None:
        """Put the RNG states back just before the first batch after a resume."""
        me = self.callback()
        if states == "saved":
            if me is not None:
                me._apply_resume_rng()
        else:
            notes = apply_rng(states, self.generators("loader"))
            if me is not None:
                me._note_all(notes)


def _index_sampler(self: Any) -> Any:
    base = self._acceptrun.original_class._index_sampler.fget(self)
    return _Tap(base, self._acceptrun)


def _iter(self: Any) -> Any:
    state = self._acceptrun
    return state.new_iterator(lambda: state.original_class.__iter__(self))


def _state_dict(self: Any) -> dict[str, Any]:
    state: dict[str, Any] = self._acceptrun.state_dict()
    return state


def _load_state_dict(self: Any, state_dict: dict[str, Any]) -> None:
    self._acceptrun.load_state_dict(state_dict)


_CLASSES: dict[type, type] = {}


def _resumable_class(cls: type) -> type:
    """``cls`` with the four members above: same instance layout, so ``__class__`` can swap."""
    if cls not in _CLASSES:
        members = {
            "__slots__": (),
            "_index_sampler": property(_index_sampler),
            "__iter__": _iter,
            "state_dict": _state_dict,
            "load_state_dict": _load_state_dict,
        }
        _CLASSES[cls] = type(f"Resumable{cls.__name__}", (cls,), members)
    return _CLASSES[cls]


class _Tap:
    """The loader's index sampler, seen through the state: what the iterator draws from."""

    def __init__(self, base: Any, state: ResumableLoader) -> None:
        self.base = base
        self.state = state

    def __len__(self) -> int:
        return len(self.base)

    def __iter__(self) -> _TapIter:
        return _TapIter(self.base, self.state)


class _TapIter:
    """Records the RNG before the sampler's first draw; on a resume, replays it and skips."""

    def __init__(self, base: Any, state: ResumableLoader) -> None:
        self.base = base
        self.it: Iterator[Any] | None = None
        self.state = state

    def prime(self) -> None:
        if self.it is not None:
            return
        st = self.state
        replay, st.replay = st.replay, None
        gens = st.sampler_generators()
        if replay is not None and replay["rng"] is not None:
            apply_rng(replay["rng"], gens)
        st.rng_before_sampler = capture_rng(gens)
        self.it = iter(self.base)  # a torch sampler draws its seed at the first next()
        for _ in range(replay["skip"] if replay is not None else 0):
            next(self.it)

    def __iter__(self) -> _TapIter:
        return self

    def __next__(self) -> Any:
        if self.it is None:
            self.prime()
        assert self.it is not None
        return next(self.it)


class _Counting:
    """The DataLoader's iterator, counting the batches it hands to Lightning."""

    def __init__(self, iterator: Any, state: ResumableLoader, at_first_batch: Any) -> None:
        self.iterator = iterator
        self.state = state
        self.at_first_batch = at_first_batch

    def __iter__(self) -> _Counting:
        return self

    def __next__(self) -> Any:
        if self.at_first_batch is not None:
            states, self.at_first_batch = self.at_first_batch, None
            self.state.first_batch(states)
        batch = next(self.iterator)
        self.state.delivered += 1
        return batch

    def __len__(self) -> int:
        return len(self.iterator)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.iterator, name)


# ---- RNG states, in types torch.load(weights_only=True) accepts -----------------------------


def capture_rng(generators: Mapping[str, torch.Generator]) -> dict[str, Any]:
    """Python, NumPy, torch (CPU, and CUDA once used) and named generators, as tensors/tuples."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    np = _numpy()
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached)
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    state["generators"] = {k: g.get_state() for k, g in generators.items()}
    return state


def apply_rng(state: Mapping[str, Any], generators: Mapping[str, torch.Generator]) -> list[str]:
    """Put ``state`` back; returns what could not be (one sentence each)."""
    notes = []
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if state.get("numpy") is not None:
        np = _numpy()
        if np is None:
            notes.append("NumPy's RNG was saved but NumPy is not importable: not restored")
        else:
            kind, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if state.get("cuda") is not None:
        saved = state["cuda"]
        here = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if here < len(saved):
            notes.append(
                f"CUDA RNG saved on {len(saved)} GPU(s), {here} here: GPU random numbers differ"
            )
        else:
            for index, rng in enumerate(saved):
                torch.cuda.set_rng_state(rng, index)
    for name, rng in (state.get("generators") or {}).items():
        if name in generators:
            generators[name].set_state(rng)
        else:
            notes.append(f"the {name} generator was saved but is gone: its stream differs")
    return notes


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy
