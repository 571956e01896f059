"""Restoring a checkpoint of training state: JSON and safetensors only, never pickle.

:func:`load_into` reads ``state.json`` and ``tensors.safetensors`` (checkpoint/tensorfile.py,
hashed in the same pass when the manifest's hash is given), decodes and checks every entry
before any object is changed, then loads each object and the RNG states.
:func:`load_ranked` does the same for one rank of a multi-process checkpoint, and
:func:`restore_values` puts saved plain values back into a script's own objects.
"""

from __future__ import annotations

import os
import random
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acceptrun._util.durable import loads_json, read_bytes_bounded
from acceptrun.checkpoint.state import (
    FORMAT,
    FORMAT_VERSION,
    RNG_KEY,
    STATE,
    TENSORS,
    check_names,
    decode,
    is_generator,
    is_module,
    is_stateful,
    is_tensor,
    numpy_module,
    rank_dir,
)
from acceptrun.checkpoint.tensorfile import (
    HashingReader,
    map_tensors,
    on_host,
    read_header,
    read_tensors,
)
from acceptrun.errors import AcceptrunError, AcceptrunRuntimeError, RecordError, UserError

if TYPE_CHECKING:
    import torch

__all__ = ["load_into", "load_ranked", "restore_values"]


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = loads_json(read_bytes_bounded(path))
    except FileNotFoundError:
        raise RecordError(
            f"{path} is missing; a training-state checkpoint holds {STATE} and {TENSORS}"
        ) from None
    except (OSError, ValueError) as exc:  # unreadable, not JSON, too deep, too large
        raise RecordError(
            f"cannot read {path} ({exc}); the checkpoint is damaged, resume from an earlier one"
        ) from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise RecordError(f"{path} is not an acceptrun training-state file (format {found!r})")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise UserError(
            f"{path}: format version {version!r} is not one this acceptrun reads "
            f"({FORMAT_VERSION}); it was written by another acceptrun version: load it "
            "with that version"
        )
    return meta


def load_into(
    path: str | Path,
    objects: Mapping[str, Any],
    *,
    device: str | torch.device | None = None,
    rng: bool = True,
    strict: bool = True,
    expect: str | None = None,
) -> dict[str, Any]:
    """Restore a checkpoint written by :func:`write_staged` into ``objects``.

    ``expect``: the manifest's hash of TENSORS (``"xxh3_128:..."``). The file is then
    hashed as it is read, in the same pass, and a mismatch raises
    :class:`TensorsHashMismatch` before any object is changed: with
    ``CheckpointStore.verify(step, defer=[TENSORS])`` first, a restore reads the bytes
    once instead of twice.

    Calls ``load_state_dict`` on each object that has one; plain values saved under a
    name come back in ``result["values"]``. Tensors are loaded onto ``device`` (default
    CPU) and each object copies them onto its own device (modules copy into their
    parameters; optimizers cast their state to the parameter's device). With ``rng``,
    the Python, NumPy, torch and CUDA RNG states are restored last. With ``strict``, the
    names must match the checkpoint's exactly and modules load strictly.

    Returns ``{"values": {...}, "meta": {...}, "notes": [...]}``; notes say what was not
    restored (CUDA RNG on a machine with fewer GPUs, names skipped when not strict).

    >>> out = load_into(ckpt_dir, {"model": model, "optimizer": opt, "extra": None})
    """
    return _load(
        Path(path), objects, device=device, rng=rng, strict=strict, world_size=1, expect=expect
    )


def restore_values(registered: Mapping[str, Any], saved: Mapping[str, Any]) -> dict[str, Any]:
    """Put saved plain values back into what is registered under the same names.

    Mutable values are restored in place, so the script's own references see them: a
    dict is cleared and updated, a list slice-assigned, a tensor or numpy array copied
    into (``copy_`` without autograd; same shape and dtype). Immutable values (numbers,
    strings, tuples, None) cannot change in place: the saved value is returned. Returns
    ``{name: value}`` for every name in both; every value is checked before any is
    changed, and one that cannot be restored raises :class:`UserError` naming it.

    >>> history = []
    >>> _ = restore_values({"history": history}, {"history": [1.0]}); history
    [1.0]
    """
    plan: list[tuple[str, Any, Any]] = []
    for name, value in saved.items():
        if name in registered:
            plan.append((name, registered[name], _checked_value(name, registered[name], value)))
    out: dict[str, Any] = {}
    for name, current, value in plan:
        if is_tensor(current):
            import torch

            with torch.no_grad():  # a parameter or a leaf that requires grad
                current.copy_(value)
            value = current
        elif isinstance(current, MutableMapping):
            current.clear()
            current.update(value)
            value = current
        elif isinstance(current, list):
            current[:] = value
            value = current
        elif _is_ndarray(current):
            current[...] = value
            value = current
        out[name] = value
    return out


_NUMBERS = (bool, int, float)


def _is_ndarray(value: Any) -> bool:
    np = sys.modules.get("numpy")  # a numpy array exists only if numpy was imported
    return np is not None and isinstance(value, np.ndarray)


def _checked_value(name: str, current: Any, value: Any) -> Any:
    """``value`` if it can replace (or fill) ``current``; else a UserError naming ``name``."""

    def refuse(why: str) -> UserError:
        return UserError(
            f"run.restore(): cannot restore {name!r}: {why}. Register the same kind of value "
            f"under {name!r} as the checkpoint holds, or rename it to start it fresh"
        )

    def kind(v: Any) -> str:
        if is_tensor(v) or _is_ndarray(v):
            return f"{type(v).__name__} of shape {tuple(v.shape)} and dtype {v.dtype}"
        return type(v).__name__

    if is_tensor(current) or _is_ndarray(current):
        if type(value) is not type(current) and not (is_tensor(current) and is_tensor(value)):
            raise refuse(f"saved as a {kind(value)}, registered as a {kind(current)}")
        if tuple(value.shape) != tuple(current.shape) or value.dtype != current.dtype:
            raise refuse(f"saved as a {kind(value)}, registered as a {kind(current)}")
        return value
    if isinstance(current, MutableMapping) and not isinstance(value, Mapping):
        raise refuse(f"saved as a {kind(value)}, registered as a {kind(current)}")
    if isinstance(current, list) and not isinstance(value, list):
        raise refuse(f"saved as a {kind(value)}, registered as a {kind(current)}")
    if current is None or value is None:
        return value
    if isinstance(current, _NUMBERS) and isinstance(value, _NUMBERS):
        return value
    if not isinstance(value, type(current)) and not isinstance(current, type(value)):
        raise refuse(f"saved as a {kind(value)}, registered as a {kind(current)}")
    return value


def load_ranked(
    path: str | Path,
    shared: Mapping[str, Any],
    own: Mapping[str, Any],
    *,
    rank: int,
    world_size: int,
    device: str | torch.device | None = None,
    strict: bool = True,
) -> dict[str, Any]:
    """Restore a multi-process (gathered) checkpoint on rank ``rank`` of ``world_size``.

    ``shared`` (model, optimizer: the same on every rank) loads from the step directory
    itself, ``own`` and this rank's RNG states from its ``rank-<r>/``. The checkpoint
    must have been saved by as many ranks: resharding is not supported.

    >>> load_ranked(ckpt, {"model": m, "optimizer": opt}, {"loader": loader}, rank=1, world_size=2)
    """
    root = Path(path)
    out = _load(root, shared, device=device, rng=False, strict=strict, world_size=world_size)
    mine = _load(
        root / rank_dir(rank), own, device=device, rng=True, strict=strict, world_size=world_size
    )
    return {
        "values": {**out["values"], **mine["values"]},
        "meta": out["meta"],
        "notes": out["notes"] + mine["notes"],
    }


def _saved_world_size(meta: Mapping[str, Any]) -> int:
    ranks = meta.get("ranks")
    return int(ranks.get("world_size", 1)) if isinstance(ranks, dict) else 1


def _load(
    root: Path,
    objects: Mapping[str, Any],
    *,
    device: str | torch.device | None,
    rng: bool,
    strict: bool,
    world_size: int,
    expect: str | None = None,
) -> dict[str, Any]:
    check_names(objects)
    meta = _read_meta(root / STATE)
    saved_world = _saved_world_size(meta)
    if saved_world != world_size:
        raise UserError(
            f"{root}: saved by a run of {saved_world} process(es), loaded by one of "
            f"{world_size}; resume it with resources.processes = {saved_world} (a "
            "checkpoint cannot be resharded to another number of processes)"
        )
    modules = {name for name, obj in objects.items() if is_module(obj)}
    tensors = _load_tensors(
        root / TENSORS, meta, device, expect,
        views=lambda key: key.split("/", 1)[0] in modules,
    )  # fmt: skip

    try:
        values, loads, rng_state, notes = _decode_all(root, meta, tensors, objects, rng, strict)
    except AcceptrunError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as exc:
        # Valid JSON of the wrong shape: a damaged (or hand-edited) state file.
        raise RecordError(
            f"{root / STATE} does not describe saved objects ({type(exc).__name__}: {exc}); "
            "the checkpoint is damaged, resume from an earlier one (`acceptrun ckpt verify`)"
        ) from exc

    for name, obj, state in loads:
        try:
            if is_generator(obj):
                obj.set_state(state.cpu())
            elif is_module(obj):
                obj.load_state_dict(state, strict=strict)
            else:
                before = _group_values(obj)
                obj.load_state_dict(state)
                _keep_group_identity(obj, before)
        except AcceptrunError as exc:
            exc.add_note(f"while loading {name!r} from {root}")
            raise
        except Exception as exc:
            # The object refused the state: saved from another model, or damaged.
            error = AcceptrunRuntimeError(
                f"{name!r} does not load from {root}: {exc} (a checkpoint of another model, "
                "or a damaged one: `acceptrun ckpt verify` tells which)"
            )
            error.add_note(f"while loading {name!r} from {root}")
            raise error from exc
    if rng_state is not None:
        notes += _restore_rng(rng_state)
    elif rng:
        notes.append("no RNG state in this checkpoint (saved with rng=False)")
    return {"values": values, "meta": meta, "notes": notes}


def _load_tensors(
    path: Path,
    meta: Mapping[str, Any],
    device: str | torch.device | None,
    expect: str | None = None,
    views: Callable[[str], bool] | None = None,
) -> Mapping[str, torch.Tensor]:
    """The tensors of TENSORS, read by this module's own reader (no safetensors package).

    The writer above is this module's own, and so is the reader: restoring a checkpoint
    needs nothing the save did not, so a workload that could save can always load. When
    state.json counts no tensors the file is checked and torch is not imported. With
    ``expect`` the bytes are hashed as they are read (the header, then the tensors in
    file order, which cover the rest exactly) and compared before anything is returned.

    ``views`` names the keys whose tensors are only copied from (a module's
    load_state_dict copies into its parameters): on the host those come back as views of
    a private memory map of the file, with no new memory to fault in and no read into it;
    every other tensor is its own copy, as without ``views``.
    """
    counted = meta.get("tensors")
    try:
        with open(path, "rb") as raw:
            size = os.fstat(raw.fileno()).st_size
            f: Any = raw if expect is None else HashingReader(raw, expect)
            entries = read_header(f, size)
            if isinstance(counted, dict) and counted.get("count") == 0:
                if entries:
                    raise ValueError(
                        f"it holds {len(entries)} tensor(s), where {STATE} counts none"
                    )
                out: Mapping[str, torch.Tensor] = {}
            elif views is not None and on_host(device) and any(views(e.key) for e in entries):
                out = map_tensors(raw, f, entries, size, views)
            else:
                out = read_tensors(f, entries, device)
            if isinstance(f, HashingReader):
                f.check(path, size)
            return out
    except FileNotFoundError:
        raise RecordError(f"{path} is missing; the checkpoint is incomplete") from None
    except (OSError, ValueError) as exc:
        raise RecordError(
            f"{path} is not a readable safetensors file ({exc}); the checkpoint "
            "is damaged, resume from an earlier one"
        ) from exc


def _decode_all(
    root: Path,
    meta: dict[str, Any],
    tensors: Mapping[str, torch.Tensor],
    objects: Mapping[str, Any],
    rng: bool,
    strict: bool,
) -> tuple[dict[str, Any], list[tuple[str, Any, Any]], Any, list[str]]:
    """Decode every saved entry against ``objects``: (values, loads, RNG state, notes)."""
    saved: dict[str, Any] = meta["objects"]
    missing = [n for n in objects if n not in saved]
    unexpected = [n for n in saved if n not in objects]
    notes: list[str] = []
    if missing or unexpected:
        problem = f"names not in the checkpoint: {missing}; only in the checkpoint: {unexpected}"
        if strict:
            raise UserError(f"{root}: {problem}; pass the names it was saved with, or strict=False")
        notes.append(f"not strict, skipped {problem}")

    # Decode and check everything first: a damaged checkpoint leaves the objects untouched.
    values: dict[str, Any] = {}
    loads: list[tuple[str, Any, Any]] = []
    for name, entry in saved.items():
        state = decode(entry["state"], tensors, name)
        obj = objects.get(name)
        if entry["kind"] == "generator" or is_generator(obj):
            if name in objects and not (entry["kind"] == "generator" and is_generator(obj)):
                raise UserError(
                    f"{name}: saved as {entry['kind']} but a {type(obj).__name__} was passed"
                )
            if name in objects:
                loads.append((name, obj, state))
            continue
        if name in objects and (entry["kind"] == "value") == is_stateful(obj):
            saved_as = "a plain value" if entry["kind"] == "value" else "state_dict()"
            raise UserError(
                f"{name}: saved as {saved_as} but a {type(obj).__name__} was passed; pass None "
                "for a plain value (it comes back in result['values']) and the object itself "
                "for a model, optimizer, ..."
            )
        if entry["kind"] == "value":
            values[name] = state
        elif name in objects:
            if "module_metadata" in entry:  # nn.Module reads versions from this attribute
                ordered: Any = OrderedDict(state)
                ordered._metadata = decode(entry["module_metadata"], tensors, name)
                state = ordered
            loads.append((name, obj, state))
    rng_state = decode(meta["rng"], tensors, RNG_KEY) if rng and meta.get("rng") else None
    return values, loads, rng_state, notes


def _group_values(obj: Any) -> list[dict[str, Any]] | None:
    """An optimizer's param_group values before a load (None for anything else)."""
    groups = getattr(obj, "param_groups", None)
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        return None
    return [dict(g) for g in groups]


def _keep_group_identity(obj: Any, before: list[dict[str, Any]] | None) -> None:
    """Put back the optimizer's own objects where a load left equal copies.

    torch builds every param_group from one ``defaults`` dict, so its groups share
    objects (Adam's ``betas`` tuple). Loaded from JSON each group gets its own copy:
    equal values, but ``torch.save(opt.state_dict())`` pickles shared and separate
    objects differently, so the script's own save after a resume would differ byte for
    byte from the uninterrupted run's. Only a value equal to the one it replaces (same
    type) is swapped back; changed ones (a scheduled ``lr``) stay as loaded.
    """
    groups = getattr(obj, "param_groups", None)
    if before is None or not isinstance(groups, list) or len(groups) != len(before):
        return
    for group, old in zip(groups, before, strict=True):
        for key, value in group.items():
            if key == "params" or key not in old:
                continue
            previous = old[key]
            if previous is not value and type(previous) is type(value) and _same(previous, value):
                group[key] = previous


def _same(a: Any, b: Any) -> bool:
    """Equal plain values (no tensors: their == is elementwise)."""
    if is_tensor(a) or is_tensor(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # an exotic value whose == raises: keep the loaded one
        return False


def _restore_rng(state: dict[str, Any]) -> list[str]:
    notes: list[str] = []
    random.setstate(state["python"])
    if state.get("torch") is not None:  # saved where torch was imported
        import torch

        torch.set_rng_state(state["torch"].cpu())
    if state.get("numpy") is not None:
        np = numpy_module()
        if np is None:
            notes.append("NumPy RNG not restored: numpy is not importable here")
        else:
            np.random.set_state(state["numpy"])
    cuda = state.get("cuda")
    if cuda is not None:
        import torch

        saved_count = cuda["device_count"]
        here = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if here < saved_count:
            notes.append(
                f"CUDA RNG not restored: saved with {saved_count} GPU(s), {here} here; "
                "random numbers drawn on the GPU (dropout) differ from the original run"
            )
        else:
            for index, rng_state in enumerate(cuda["states"]):
                torch.cuda.set_rng_state(rng_state.cpu(), index)
    return notes
