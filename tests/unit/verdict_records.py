"""Run records written directly, file by file, for the verdict's unit tests.

A :class:`RecordBuilder` writes what the supervisor and the client would have left in a
run directory (run.json, spec.toml, events.jsonl, attempts/N/exit.json, preflight.json,
provenance.json, telemetry.jsonl, ledger.json, checkpoints through the real
:class:`~acceptrun.checkpoint.store.CheckpointStore`) without starting a process, so a
verdict check can be tested in milliseconds.

>>> rb = RecordBuilder(tmp_path, "[acceptance]\\nmax_first_step = 60")
>>> rb.event("run_start", t=0.0); rb.event("step", t=5.0, step=1)
>>> rb.check("first step").status == "pass"
True
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.workspace import RunRecord
from acceptrun.verdict.core import Check, Verdict, compute_verdict

T0 = 1_796_000_000.0  # unix seconds of the first event unless a test gives its own


class RecordBuilder:
    """One run record under ``root/runs/<run_id>``, written one file at a time."""

    def __init__(
        self,
        root: Path,
        spec: str = "",
        *,
        run_id: str = "20261201-120000-t-0001",
        mode: str = "supervised",
        **state: Any,
    ) -> None:
        self.record = RunRecord(root / "runs" / run_id)
        self.record.path.mkdir(parents=True)
        self.root = root
        head = 'name = "t"\ncommand = ["python", "train.py"]\n'
        self.record.spec_path.write_text(head + textwrap.dedent(spec))
        self.write_json("run.json", {"run_id": run_id, "name": "t", "status": "finished",
                                     "mode": mode, **state})  # fmt: skip

    def write_json(self, name: str, obj: Any) -> None:
        path = self.record.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj))

    def event(self, kind: str, *, t: float = 0.0, **fields: Any) -> None:
        """Append one event at ``T0 + t`` seconds."""
        with self.record.events_path.open("a") as f:
            f.write(json.dumps({"t": T0 + t, "kind": kind, **fields}) + "\n")

    def sample(self, kind: str, *, t: float = 0.0, **fields: Any) -> None:
        """Append one telemetry sample (``host``, ``gpu``, ``gpu_absent``, ...)."""
        with self.record.telemetry_path.open("a") as f:
            f.write(json.dumps({"t": T0 + t, "kind": kind, **fields}) + "\n")

    def attempt(
        self,
        n: int = 1,
        *,
        outcome: str = "success",
        reason: str = "exited with code 0",
        duration_s: float = 10.0,
        **fields: Any,
    ) -> None:
        """attempts/N/exit.json, as the supervisor writes it when the attempt ends."""
        self.write_json(f"attempts/{n}/exit.json", {"attempt": n, "outcome": outcome,
                        "reason": reason, "duration_s": duration_s, **fields})  # fmt: skip

    def training(
        self, steps: int = 10, *, step_time: float = 1.0, start: float = 2.0, **per_step: Any
    ) -> None:
        """One successful supervised attempt: run_start at 0, attempt_start at ``start``,
        ``steps`` steps ``step_time`` seconds apart, attempt_exit, exit.json."""
        self.event("run_start")
        self.event("attempt_start", t=start, attempt=1)
        t = start
        for step in range(1, steps + 1):
            t += step_time
            self.event("step", t=t, attempt=1, step=step, step_time=step_time, **per_step)
        self.event("attempt_exit", t=t + 0.5, attempt=1, outcome="success")
        self.attempt(1, duration_s=t + 0.5 - start)

    def preflight(self, *checks: tuple[str, bool, str], **details: dict[str, Any]) -> None:
        """preflight.json with checks ``(name, ok, message)``; ``details`` by check name."""
        self.write_json("preflight.json", {"checks": [
            {"name": n, "ok": ok, "message": m, "details": details.get(n, {})}
            for n, ok, m in checks
        ]})  # fmt: skip

    def checkpoint(self, step: int, data: bytes = b"weights") -> Path:
        """Commit a real checkpoint of ``step`` in the record's checkpoints directory."""
        store = CheckpointStore(self.record.checkpoints_dir)
        writer = store.begin(step)
        writer.write_bytes("model.pt", data)
        info = store.commit(writer)
        return info.path

    def verdict(self) -> Verdict:
        return compute_verdict(self.record)

    def checks(self, name: str) -> list[Check]:
        """Every check of the verdict named ``name``."""
        return [c for c in self.verdict().checks if c.name == name]

    def check(self, name: str) -> Check:
        """The one check named ``name`` (fails the test if there is none or several)."""
        found = self.checks(name)
        assert len(found) == 1, f"{len(found)} checks named {name!r}: {found}"
        return found[0]
