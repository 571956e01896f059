"""Run records written directly, for tests that read records in milliseconds.

:class:`RecordBuilder` writes what ``acceptrun run``, the supervisor and the client leave
in a run directory (run.json, spec.toml, events.jsonl, attempts/N/exit.json, committed
checkpoints) without starting a process. Calls chain; ``build()`` returns the
:class:`~acceptrun.record.workspace.RunRecord`::

    record = (
        RecordBuilder(tmp_path)
        .run(status="finished")
        .attempt(outcome="signaled", steps=range(1, 6))
        .checkpoint(5)
        .attempt(outcome="success", steps=range(6, 11), resume_step=5)
        .build()
    )

Times are unix seconds from ``T0``, advancing ``step_time`` per step, so a test can
compute every expected figure by hand.

Beside it: :func:`run_with_checkpoints` (a record made by the workspace, with real
committed checkpoints, for gc and retention) and :func:`make_checkpoint` (a checkpoint
written by hand in the store's format, for the mirror tests of both tiers).
"""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from acceptrun._util.durable import write_atomic, write_json_atomic
from acceptrun._util.hashing import hash_bytes
from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore
from acceptrun.record.workspace import RunRecord, Workspace, now_iso

__all__ = [
    "LAMBDA_SPEC",
    "T0",
    "Events",
    "RecordBuilder",
    "assert_same_checkpoint",
    "commit_step",
    "entries",
    "make_checkpoint",
    "run_with_checkpoints",
    "steps_on_disk",
    "tree",
]

T0 = 1_796_000_000.0  # unix seconds of run_start


class RecordBuilder:
    """One run record under ``root/runs/<run_id>``, written file by file."""

    def __init__(
        self, root: Path, *, run_id: str = "20261201-120000-t-0001", name: str = "t"
    ) -> None:
        self.record = RunRecord(Path(root) / "runs" / run_id)
        self.record.path.mkdir(parents=True)
        self.name = name
        self.t = T0  # the clock of the next event
        self.attempts = 0
        self.record.spec_path.write_text(f'name = "{name}"\ncommand = ["python", "train.py"]\n')

    # ---- files -----------------------------------------------------------------------

    def write_json(self, name: str, obj: Any) -> RecordBuilder:
        path = self.record.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj))
        return self

    def event(self, kind: str, *, dt: float = 0.0, **fields: Any) -> RecordBuilder:
        """Append one event ``dt`` seconds after the previous one."""
        self.t += dt
        with self.record.events_path.open("a") as f:
            f.write(json.dumps({"t": self.t, "kind": kind, **fields}) + "\n")
        return self

    # ---- what a run leaves -----------------------------------------------------------

    def run(
        self, status: str = "finished", *, format: int | None = 1, **state: Any
    ) -> RecordBuilder:
        """run.json (``format=None``: an old record without one) and the run_start event."""
        data: dict[str, Any] = {"format": format} if format is not None else {}
        data |= {"run_id": self.record.run_id, "name": self.name, "status": status,
                 "verdict": None, "attempts": 0, **state}  # fmt: skip
        self.write_json("run.json", data)
        return self.event("run_start", spec_hash="0" * 64)

    def attempt(
        self,
        outcome: str = "success",
        steps: Iterable[int] = (),
        *,
        step_time: float = 1.0,
        loss: float | None = None,
        failure_class: str | None = None,
        resume_step: int | None = None,
        work: dict[str, Any] | None = None,
        **exit_fields: Any,
    ) -> RecordBuilder:
        """One attempt: attempt_start, a step event per step, attempt_exit and exit.json.

        ``loss`` (when given) is logged on each step as ``loss / step``.
        """
        self.attempts += 1
        n = self.attempts
        self.event("attempt_start", dt=1.0, attempt=n, pid=1000 + n, command=["python"],
                   resume_step=resume_step)  # fmt: skip
        started = self.t
        for step in steps:
            values = {} if loss is None else {"loss": loss / max(step, 1)}
            self.event("step", dt=step_time, attempt=n, step=step, step_time=step_time, **values)
        exit_json: dict[str, Any] = {
            "format": 1,
            "attempt": n,
            "outcome": outcome,
            "returncode": 0 if outcome == "success" else None,
            "signal": None,
            "started_at": None,
            "ended_at": None,
            "duration_s": round(self.t + 0.5 - started, 3),
            "reason": "exited 0" if outcome == "success" else outcome,
            "work": work or {},
            "decision": None,
            **exit_fields,
        }
        if failure_class is not None:
            exit_json["class"] = failure_class
        self.event("attempt_exit", dt=0.5, **exit_json)
        self.write_json(f"attempts/{n}/exit.json", exit_json)
        self.write_json("run.json", {**self._state(), "attempts": n})
        return self

    def checkpoint(self, step: int, data: bytes = b"weights") -> RecordBuilder:
        """Commit a real checkpoint of ``step`` (manifest, LATEST) and its commit event."""

        def on_event(kind: str, fields: dict[str, Any]) -> None:
            self.event(kind, attempt=self.attempts, **fields)

        store = CheckpointStore(self.record.checkpoints_dir, on_event=on_event)
        writer = store.begin(step)
        writer.write_bytes("model.pt", data)
        store.commit(writer)
        return self

    def metric(self, name: str, value: Any) -> RecordBuilder:
        return self.event("metric", attempt=self.attempts, name=name, value=value)

    def verdict(self, accepted: bool = True, *, format: int | None = 1) -> RecordBuilder:
        """verdict.json with no checks (enough for readers of the file)."""
        data: dict[str, Any] = {"format": format} if format is not None else {}
        data |= {"run_id": self.record.run_id, "verdict": "accepted" if accepted else "rejected",
                 "accepted": accepted, "decided_at": "2026-12-01T12:00:00Z", "failed": [],
                 "checks": []}  # fmt: skip
        return self.write_json("verdict.json", data)

    def build(self) -> RunRecord:
        return self.record

    def _state(self) -> dict[str, Any]:
        found = self.record.read_json("run.json")
        return found if isinstance(found, dict) else {}


# ---- a checkpoint store's steps (the store's tests of both tiers) ----------------------


class Events:
    """An on_event sink that remembers (kind, fields) pairs."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, kind: str, fields: dict[str, Any]) -> None:
        self.seen.append((kind, fields))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [f for k, f in self.seen if k == kind]


def commit_step(
    store: CheckpointStore, step: int, data: bytes | None = None, **metrics: float
) -> CheckpointInfo:
    """Commit ``step``: model.bin (``data``, or a text naming the step) and state.json."""
    writer = store.begin(step)
    writer.write_bytes("model.bin", data if data is not None else f"weights {step}".encode())
    writer.write_json("state.json", {"step": step})
    return store.commit(writer, metrics=metrics)


def entries(root: Path) -> list[str]:
    """The names directly under ``root``, sorted."""
    return sorted(p.name for p in root.iterdir())


# ---- a workspace's run with real checkpoints (gc, retention) ---------------------------


def run_with_checkpoints(
    ws: Workspace,
    workdir: Path,
    name: str,
    steps: list[int],
    *,
    extra: str = "",
    metrics: dict[int, float] | None = None,
    **state: Any,
) -> RunRecord:
    """A real record with committed checkpoints of 1 KiB * step index, then ``state``."""
    spec = f'name = "{name}"\ncommand = [{json.dumps(sys.executable)}, "-c", "pass"]\n'
    spec += f"workdir = {json.dumps(str(workdir))}\n{extra}"
    record = ws.create_run(name, spec_text=spec, state={"mode": "supervised"})
    store = CheckpointStore(record.checkpoints_dir, keep_last=100)
    for n, step in enumerate(steps, 1):
        writer = store.begin(step)
        writer.write_bytes("weights.bin", bytes(1024 * n))
        loss = (metrics or {}).get(step)
        store.commit(writer, metrics={"loss": loss} if loss is not None else None)
    record.update_state(**state)
    return record


def steps_on_disk(record: RunRecord) -> list[int]:
    return [i.step for i in CheckpointStore(record.checkpoints_dir).list()]


# ---- checkpoints written by hand (the mirror tests of both tiers) ----------------------


def make_checkpoint(root: Path, step: int, files: dict[str, bytes] | None = None) -> Path:
    """A committed checkpoint in the store's format: files, MANIFEST.json last, LATEST."""
    if files is None:
        files = {
            "model.safetensors": secrets.token_bytes(64 * 1024),
            "optim/state.bin": secrets.token_bytes(4096),
            "meta.json": json.dumps({"step": step}).encode(),
        }
    step_dir = root / f"step-{step}"
    listed = {}
    for rel, data in files.items():
        (step_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (step_dir / rel).write_bytes(data)
        listed[rel] = {"size": len(data), "hash": hash_bytes(data)}
    manifest = {
        "kind": "acceptrun.checkpoint",
        "schema": 1,
        "step": step,
        "created_at": now_iso(),
        "algorithm": "xxh3_128",
        "files": listed,
        "total_bytes": sum(e["size"] for e in listed.values()),
        "metrics": {"loss": 1.0 / (step + 1)},
        "meta": {},
    }
    write_json_atomic(step_dir / "MANIFEST.json", manifest)
    write_atomic(root / "LATEST", f"step-{step}\n")
    return step_dir


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (directories implied)."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def assert_same_checkpoint(local: Path, restored: Path) -> None:
    assert tree(restored) == tree(local)


# ---- specs ---------------------------------------------------------------------------

# A spec tied to Lambda in every way portability names: mounts, paths, buckets, an image,
# pinned GPUs and driver (the portability tests of both tiers).
LAMBDA_SPEC = """
name = "lam"
command = "cd /lambda/nfs/team/proj && nvidia-smi && python train.py --data=/lambda/nfs/data/tokens && aws s3 sync out s3://ckpts-us-east-1/lam"
workdir = "."
env = { HF_HOME = "/lambda/nfs/hf-cache", AWS_REGION = "us-east-1", RUN_NOTE = "plain text" }

[resources]
gpus = 8
gpu_types = ["H100"]

[expect]
cuda = "12.4"
driver = ">=550"

[data]
path = "/lambda/nfs/data/tokens"

[checkpoint]
dir = "/home/ubuntu/ckpt"
every_steps = 500

[skypilot]
image_id = "docker:123456789012.dkr.ecr.us-east-1.amazonaws.com/train:latest"
"""
