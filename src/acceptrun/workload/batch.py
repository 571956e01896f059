"""Batch inference in the workload: shards handed out, outputs committed exactly once.

::

    run = acceptrun.init()
    for shard in run.inference.shards():
        outputs = [model(x) for x in shard.values]
        shard.commit(outputs, tokens=sum(len(o) for o in outputs))

A shard is ``inference.shard_size`` consecutive input items (:mod:`.items`). Committing
one writes its outputs file (``<output>/shard-00007.jsonl``, one ``{"id", "output"}``
line per item, in input order) atomically (temp, fsync, rename, fsync of the directory),
hashes it, and then writes the shard's manifest into the run record
(``inference/shards/shard-00007.json``): the manifest is the commit marker. A kill
before the manifest leaves the shard uncommitted and it is redone (the outputs file is
replaced whole); a kill after it leaves it committed and it is skipped. There is one
manifest per shard index, so no item can be counted twice.

Per-item failures (``shard.fail(item, error)``) are listed in the manifest with their
error and have no output line. With ``resources.processes = W`` rank ``r`` takes shards
``r, r + W, r + 2W, ...``. A stop request (SIGTERM) is honoured between shards: the
shard in hand is finished and committed, then the process exits 143.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acceptrun._util.durable import read_json, write_atomic, write_json_atomic
from acceptrun._util.hashing import hash_bytes, hash_file
from acceptrun.errors import UserError
from acceptrun.record.workspace import now_iso
from acceptrun.workload.items import Item, ShardInput, iter_shards

if TYPE_CHECKING:
    from acceptrun.spec.model import InferenceSpec
    from acceptrun.workload.run import Run

__all__ = ["BatchJob", "Shard", "encode_output", "manifest_dir", "output_name"]

MANIFEST_DIR = "inference/shards"  # in the run record: one commit marker per shard
_TEMP_RE = re.compile(r"^\.shard-(\d+)\.jsonl?\.tmp-")  # durable.write_atomic's temporaries


def output_name(index: int) -> str:
    """``shard-00007.jsonl``: the outputs file of shard ``index``."""
    return f"shard-{index:05d}.jsonl"


def manifest_dir(run_dir: Path) -> Path:
    """Where the shards' manifests (commit markers) live in a run record."""
    return run_dir / MANIFEST_DIR


def encode_output(item_id: Any, output: Any) -> bytes:
    """One output line: compact JSON with sorted keys, so a redo writes the same bytes."""
    try:
        text = json.dumps(
            {"id": item_id, "output": output},
            ensure_ascii=False,
            sort_keys=True,
            separators=(",", ":"),
            allow_nan=False,
        )
    except (TypeError, ValueError) as exc:
        raise UserError(
            f"the output of item {item_id!r} is not JSON ({exc}); return str, numbers, "
            "lists or dicts (a tensor: .tolist(); a number: float(...))"
        ) from None
    return text.encode() + b"\n"


def _resolve(value: str) -> str:
    return value if "://" in value else str(Path(value).expanduser().resolve())


class Shard:
    """One shard of the input: its items, their failures, and its commit.

    ``items`` are :class:`~acceptrun.workload.items.Item` (``id``, ``index``,
    ``value``); ``values`` the plain values, ``ids`` their ids, in the same order.
    """

    def __init__(self, job: BatchJob, data: ShardInput) -> None:
        self._job = job
        self.index = data.index
        self.items: list[Item] = data.items
        self.input_hash = data.input_hash
        self._failed: dict[Any, str] = {}
        self._started = time.perf_counter()
        self.committed = False

    @property
    def values(self) -> list[Any]:
        """The items' values (a dict per JSONL record, a str per text line)."""
        return [item.value for item in self.items]

    @property
    def ids(self) -> list[Any]:
        return [item.id for item in self.items]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self.items)

    def fail(self, item: Item | Any, error: BaseException | str) -> None:
        """List ``item`` (an Item or its id) as failed with ``error``; it gets no output.

        ::

            try:
                out.append(model(item.value))
            except ValueError as exc:
                shard.fail(item, exc)
        """
        item_id = item.id if isinstance(item, Item) else item
        if item_id not in set(self.ids):
            raise ValueError(f"shard {self.index} has no item with id {item_id!r}")
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self._failed[item_id] = text[:2000] or "failed"

    def commit(
        self,
        outputs: Sequence[Any] | dict[Any, Any],
        *,
        tokens: int | None = None,
        latencies: Sequence[float] | None = None,
    ) -> None:
        """Write the shard's outputs and commit it; afterwards it is never redone.

        ``outputs``: one per item in order (entries of failed items are ignored), or one
        per item that did not fail, or a dict ``{id: output}``. ``tokens``: tokens the
        shard produced (or processed), for tokens/s and cost per million tokens.
        ``latencies``: seconds per item, when the model times them; otherwise each
        item counts the shard's time divided by its items.
        """
        if self.committed:
            raise RuntimeError(f"shard {self.index} is already committed")
        seconds = time.perf_counter() - self._started
        by_id = self._match(outputs)
        if latencies is not None and len(latencies) != len(self.items):
            raise ValueError(
                f"shard {self.index}: {len(latencies)} latencies for {len(self.items)} items; "
                "give one per item or none"
            )
        self._job._commit(self, by_id, seconds=seconds, tokens=tokens, latencies=latencies)
        self.committed = True

    def _match(self, outputs: Sequence[Any] | dict[Any, Any]) -> dict[Any, Any]:
        ok_ids = [i for i in self.ids if i not in self._failed]
        if isinstance(outputs, dict):
            extra = [k for k in outputs if k not in set(self.ids)]
            missing = [i for i in ok_ids if i not in outputs]
            if extra or missing:
                raise ValueError(
                    f"shard {self.index}: outputs by id must cover every item not failed; "
                    f"missing {missing[:5]}, unknown {extra[:5]}"
                )
            return {i: outputs[i] for i in ok_ids}
        outputs = list(outputs)
        if len(outputs) == len(self.items):
            return {i: o for i, o in zip(self.ids, outputs, strict=True) if i not in self._failed}
        if len(outputs) == len(ok_ids):
            return dict(zip(ok_ids, outputs, strict=True))
        raise ValueError(
            f"shard {self.index}: {len(outputs)} outputs for {len(self.items)} items "
            f"({len(self._failed)} failed); give one per item, or one per item not failed"
        )


class BatchJob:
    """The batch side of a run: ``run.inference`` (see the module docstring)."""

    def __init__(self, run: Run, spec: InferenceSpec) -> None:
        if not spec.enabled or spec.input is None:
            raise UserError(
                "run.inference: the spec has no [inference] section; add one with the input "
                'items, e.g. [inference] input = "data/prompts.jsonl", output = "out/labels"'
            )
        self.run = run
        self.spec = spec
        # The frozen spec's paths are absolute; others are relative to the working directory.
        self.input: str = _resolve(spec.input)
        self.output_dir = Path(_resolve(spec.output))
        self.manifests = manifest_dir(run.run_dir)
        self.committed_now = 0  # shards committed by this process

    def committed(self, index: int, input_hash: str) -> bool:
        """Whether shard ``index`` is committed: its manifest, and its outputs file intact."""
        path = self.manifests / f"shard-{index:05d}.json"
        manifest = read_json(path) if path.exists() else None
        if not isinstance(manifest, dict):
            return False
        if manifest.get("input_hash") != input_hash:
            raise UserError(
                f"inference.input changed since shard {index} was committed (its items now "
                f"hash to {input_hash}, then {manifest.get('input_hash')}); a run's input "
                "must not change: restore it, or start a new run"
            )
        path = self.output_dir / str(manifest.get("file"))
        try:
            digest, _ = hash_file(path)
        except OSError:
            digest = None
        if digest == manifest.get("hash"):
            return True
        self.run.record.event(
            "shard_redo", attempt=self.run.attempt, shard=index,
            reason=f"{path} is missing or changed since its commit",
            **self.run._rank_field(),
        )  # fmt: skip
        return False

    def shards(self) -> Iterator[Shard]:
        """This process's shards that are not committed yet, in order.

        Each yielded shard must be committed (or its items failed and committed) before
        the next is asked for. Between shards a stop request ends the process (143).
        """
        self.run.handle_stops()  # SIGTERM becomes "finish this shard, then exit"
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.manifests.mkdir(parents=True, exist_ok=True)
        rank, world = self.run.rank, self.run.world_size
        self._remove_stale_temps(rank, world)
        last: int | None = None
        for data in iter_shards(
            self.input, self.spec.shard_size, fmt=self.spec.format, id_field=self.spec.id_field
        ):
            if data.index % world != rank or self.committed(data.index, data.input_hash):
                continue
            if self.run._stop_signal:
                self.run.exit_stopped(last if last is not None else -1, checkpoint=None)
            shard = Shard(self, data)
            yield shard
            if not shard.committed:
                raise UserError(
                    f"shard {shard.index} was handed out but not committed; call "
                    "shard.commit(outputs) before asking for the next shard"
                )
            last = shard.index

    def _remove_stale_temps(self, rank: int, world: int) -> None:
        """Temporary files a killed attempt left mid-write (``.shard-00007.jsonl.tmp-...``).

        Only this rank's shards: every process of the attempt that wrote them is gone,
        since the supervisor restarts all ranks together.
        """
        for folder in (self.output_dir, self.manifests):
            for path in folder.glob(".shard-*.tmp-*"):
                match = _TEMP_RE.match(path.name)
                if match and int(match[1]) % world == rank:
                    path.unlink(missing_ok=True)

    def _commit(
        self,
        shard: Shard,
        outputs: dict[Any, Any],
        *,
        seconds: float,
        tokens: int | None,
        latencies: Sequence[float] | None,
    ) -> None:
        body = b"".join(encode_output(i, outputs[i]) for i in shard.ids if i in outputs)
        name = output_name(shard.index)
        digest = hash_bytes(body)
        # The outputs file first, whole; the manifest after it is the commit marker.
        write_atomic(self.output_dir / name, body)
        manifest: dict[str, Any] = {
            "shard": shard.index,
            "file": name,
            "hash": digest,
            "bytes": len(body),
            "items": len(shard.items),
            "first_index": shard.items[0].index,
            "outputs": len(outputs),
            "failed": [{"id": i, "error": e} for i, e in shard._failed.items()],
            "input_hash": shard.input_hash,
            "seconds": round(seconds, 6),
            "tokens": tokens,
            "latencies": None if latencies is None else [round(float(x), 6) for x in latencies],
            "rank": self.run.rank,
            "attempt": self.run.attempt,
            "committed_at": now_iso(),
        }
        write_json_atomic(self.manifests / f"shard-{shard.index:05d}.json", manifest)
        self.committed_now += 1
        self.run.record.event(
            "shard_commit", attempt=self.run.attempt, shard=shard.index, file=name,
            hash=digest, items=len(shard.items), failed=len(shard._failed),
            seconds=round(seconds, 6), tokens=tokens, **self.run._rank_field(),
        )  # fmt: skip
        values: dict[str, float] = {"samples": len(shard.items), "shard_s": round(seconds, 6)}
        if tokens is not None:
            values["tokens"] = tokens
        # A step event per shard: progress, hang detection, `top` and injected faults
        # (--inject kill@step=N fires right after shard N is committed).
        self.run.log(shard.index, **values)
