"""Which run a checkpoint store belongs to, and the one way to open a run's own store.

Every store root holds ``OWNER.json`` (written atomically when the store is created)::

    {"kind": "acceptrun.checkpoint_store", "schema": 1, "run_id": "...", "spec": "...",
     "run_created_at": "...", "created_at": "..."}

A run restores, prunes, mirrors and lists only the steps of a store it owns. Where the
store is (:func:`store_root`):

- no ``checkpoint.dir``: ``<record>/checkpoints``;
- ``checkpoint.dir = D``: ``D/<run id>/`` for every run launched since stores had owners
  (run.json says ``"checkpoint_layout": "run-subdir"``), so the same spec run twice in a
  row, or two specs of one team folder, each get their own store under ``D``;
- a record from before: ``D`` itself, as it was launched (claimed by that run on its
  next write, refused to any other run that claimed it first).

A fresh launch creates its store (:func:`create_run_store`) and refuses one that already
holds anything: attempt 1 starts from its own empty store, whatever ``D`` holds.
Everything else (the supervisor, ``acceptrun resume``, ``ckpt``, ``gc``, restore drills,
reports, the client on every rank, the framework integrations) opens the store through
:func:`open_run_store`, which checks the owner and raises :class:`StoreOwnedError`
naming the directory, its owner and the fix.

>>> store = open_run_store(record, spec)   # the run's own store, owner checked
>>> store.list()
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acceptrun._util.durable import read_json, write_json_atomic
from acceptrun.checkpoint.store import CheckpointStore, EventSink
from acceptrun.errors import RecordError, UserError
from acceptrun.record.workspace import RunRecord, now_iso
from acceptrun.spec.model import RunSpec, load_spec

__all__ = [
    "LAYOUT_KEY",
    "OWNER",
    "PER_RUN",
    "StoreOwnedError",
    "StoreOwner",
    "check_fresh",
    "create_run_store",
    "mirror_root",
    "open_run_store",
    "owner_of",
    "parse_owner",
    "read_owner",
    "store_root",
]

OWNER = "OWNER.json"
OWNER_KIND = "acceptrun.checkpoint_store"
OWNER_SCHEMA = 1
LAYOUT_KEY = "checkpoint_layout"  # in run.json: where checkpoint.dir puts the run's store
PER_RUN = "run-subdir"  # checkpoint.dir/<run id>/; absent (older records): checkpoint.dir itself


class StoreOwnedError(UserError):
    """A checkpoint store that belongs to another run (or whose owner cannot be read)."""


@dataclass(frozen=True, slots=True)
class StoreOwner:
    """The run a store belongs to: its id, its spec's name and when its record was created.

    ``run_created_at`` tells apart two records that share a run id (``--run-id`` reused
    in another workspace); None (unknown) matches any.
    """

    run_id: str
    spec: str
    run_created_at: str | None = None

    def same_run(self, other: StoreOwner) -> bool:
        if self.run_id != other.run_id:
            return False
        known = self.run_created_at is not None and other.run_created_at is not None
        return not known or self.run_created_at == other.run_created_at

    def describe(self) -> str:
        when = f", created {self.run_created_at}" if self.run_created_at else ""
        return f"run {self.run_id} (spec {self.spec!r}{when})"

    def to_doc(self) -> dict[str, Any]:
        return {
            "kind": OWNER_KIND, "schema": OWNER_SCHEMA, "run_id": self.run_id,
            "spec": self.spec, "run_created_at": self.run_created_at, "created_at": now_iso(),
        }  # fmt: skip


def owner_of(record: RunRecord) -> StoreOwner:
    """The owner a store of ``record`` records: its run id, spec name, creation time."""
    try:
        state = record.state
    except RecordError:
        state = {}
    created = state.get("created_at")
    return StoreOwner(
        record.run_id,
        str(state.get("name") or record.run_id),
        created if isinstance(created, str) else None,
    )


def read_owner(root: str | Path) -> StoreOwner | None:
    """The owner recorded in ``root/OWNER.json``; None when there is none (an older store).

    A damaged or foreign file raises :class:`StoreOwnedError`: whose store it is cannot
    be told, so no run may use it until a person decides.
    """
    path = Path(root) / OWNER
    if not path.is_file():
        return None
    try:
        doc = read_json(path)
    except (OSError, RecordError) as exc:
        doc = {"error": str(exc)}
    return parse_owner(doc, str(path))


def parse_owner(doc: Any, where: str) -> StoreOwner:
    """The owner an OWNER.json document names (a local store's or a mirror root's)."""
    run_id = doc.get("run_id") if isinstance(doc, dict) else None
    if not (isinstance(doc, dict) and doc.get("kind") == OWNER_KIND and isinstance(run_id, str)):
        raise StoreOwnedError(
            f"{where} does not say which run owns the checkpoints beside it (it is damaged "
            "or not acceptrun's). If that directory holds only this run's checkpoints, "
            f"delete {where} and retry; otherwise set checkpoint.dir (or checkpoint.mirror) "
            "elsewhere"
        )
    created = doc.get("run_created_at")
    return StoreOwner(
        run_id, str(doc.get("spec") or run_id), created if isinstance(created, str) else None
    )


def store_root(record: RunRecord, spec: RunSpec | None = None) -> Path:
    """Where ``record``'s checkpoints are (see the module docstring); nothing is read but
    run.json, nothing created. ``spec``: the record's frozen spec (loaded when None)."""
    spec = load_spec(record.spec_path) if spec is None else spec
    ck = spec.checkpoint
    if not ck.dir:
        return record.checkpoints_dir
    base = Path(spec.resolve_path(ck.dir))
    try:
        per_run = record.state.get(LAYOUT_KEY) == PER_RUN
    except RecordError:  # run.json damaged: a reader still finds the store by its owner file
        per_run = (base / record.run_id / OWNER).is_file()
    return base / record.run_id if per_run else base


def mirror_root(record: RunRecord, spec: RunSpec) -> str | None:
    """The run's own mirror root, ``checkpoint.mirror/<run id>``; None without a mirror.

    One root per run id, so no run's uploads, retention or fetches reach another's; a
    relative path is the workdir's (where the workload opens it). Each root holds an
    OWNER.json like a store's (checkpoint/mirror.py checks it before it writes or deletes).
    """
    base = spec.checkpoint.mirror
    if not base:
        return None
    if "://" not in base and not Path(base).is_absolute():
        base = str(spec.workdir_path / base)
    return f"{base.rstrip('/')}/{record.run_id}"


def open_run_store(
    record: RunRecord,
    spec: RunSpec | None = None,
    *,
    root: str | Path | None = None,
    retention: bool = True,
    on_event: EventSink | None = None,
    claim: bool = False,
) -> CheckpointStore:
    """The run's own :class:`CheckpointStore`, its owner checked: the only way to open one.

    ``root`` overrides :func:`store_root` where the directory was handed over already
    (``ACCEPTRUN_CHECKPOINT_DIR`` in the workload, on every rank). ``retention``: the
    spec's ``keep_last``/``keep_every``/``keep_best``. ``claim``: this process writes to
    the store, so an owner-less one (an older record's, or a standalone run's first save)
    is recorded as this run's. A store another run owns raises :class:`StoreOwnedError`.
    """
    spec = load_spec(record.spec_path) if spec is None and (root is None or retention) else spec
    path = Path(root) if root is not None else store_root(record, spec)
    me = owner_of(record)
    found = read_owner(path)
    if found is not None and not found.same_run(me):
        raise StoreOwnedError(_foreign(path, found, me, spec))
    kwargs: dict[str, Any] = {}
    if retention and spec is not None:
        ck = spec.checkpoint
        metric, _, mode = (ck.keep_best or "").rpartition(":")
        kwargs = {
            "keep_last": ck.keep_last, "keep_every": ck.keep_every,
            "keep_best": (metric, mode) if ck.keep_best else None,
        }  # fmt: skip
    store = CheckpointStore(path, on_event=on_event, **kwargs)
    if claim and found is None:
        path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path / OWNER, me.to_doc())
    return store


def create_run_store(record: RunRecord, spec: RunSpec) -> Path:
    """Create a fresh run's store and record its owner; refuse a directory with anything in it.

    Called once per launch, before preflight: attempt 1 of a new run starts from its own
    empty store, never from what another run (or a deleted record with the same run id)
    left there.
    """
    path = store_root(record, spec)
    check_fresh(path, record.run_id)
    path.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path / OWNER, owner_of(record).to_doc())
    return path


def check_fresh(path: Path, run_id: str) -> None:
    """Raise :class:`StoreOwnedError` unless ``path`` (a new run's store) is absent or empty.

    Only a reused ``--run-id`` (a deleted record's, another workspace's) can meet a store
    there: a new run id is new.
    """
    if not path.is_dir() or not any(path.iterdir()):
        return
    found = read_owner(path)
    who = found.describe() if found is not None else "no run (its OWNER.json is missing)"
    raise StoreOwnedError(
        f"the checkpoint directory {path} of the new run {run_id} is not empty: it is the "
        f"store of {who}. A new run starts from an empty store of its own, never from "
        "another run's steps: choose another --run-id, move that directory aside, or set "
        "checkpoint.dir elsewhere"
    )


def _foreign(path: Path, found: StoreOwner, me: StoreOwner, spec: RunSpec | None) -> str:
    dir_set = spec is not None and bool(spec.checkpoint.dir)
    fix = (
        "Each run launched now keeps its checkpoints in checkpoint.dir/<run id>/; this record "
        "predates that and shares the directory with that run: resume that run instead, or "
        f"move {path} aside"
        if dir_set and path.name != me.run_id
        else f"resume that run with `acceptrun resume {found.run_id}`, or set checkpoint.dir "
        "elsewhere"
    )
    return (
        f"the checkpoint store {path} belongs to {found.describe()}, not to {me.describe()}: "
        f"this run never restores, prunes, mirrors or lists another run's steps. {fix}"
    )
