"""Run records for the verdict's unit tests: tests/builders.py plus what the verdict reads.

:class:`VerdictRecord` is a :class:`tests.builders.RecordBuilder` (run.json, spec.toml,
events.jsonl, attempts/N/exit.json, real checkpoints) that also writes the spec's own
sections, preflight.json, provenance.json, telemetry samples and events at given times,
and computes the verdict over the record, all without starting a process.

>>> rb = VerdictRecord(tmp_path, '[acceptance]\\nmax_first_step = "1m"\\n')
>>> rb.training(steps=3, start=2.0, step_time=1.0)  # the first step 3 s after launch
>>> rb.check("first step").evidence
'3.0s after launch, at most 1m00s'
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from tests.builders import T0, RecordBuilder

from acceptrun.verdict.core import Check, Verdict
from acceptrun.verdict.decide import compute_verdict

__all__ = ["T0", "VerdictRecord"]


class VerdictRecord(RecordBuilder):
    """A run record with the spec ``spec`` (TOML after name and command) and run.json
    written (``mode``, ``state``), its run_start event at ``T0``."""

    def __init__(
        self,
        root: Path,
        spec: str = "",
        *,
        run_id: str = "20261201-120000-t-0001",
        mode: str = "supervised",
        **state: Any,
    ) -> None:
        super().__init__(root, run_id=run_id)
        with self.record.spec_path.open("a") as f:
            f.write(textwrap.dedent(spec))
        self.run(mode=mode, **state)

    def at(self, t: float, kind: str, **fields: Any) -> VerdictRecord:
        """Append one event at ``T0 + t`` seconds (later events continue from there)."""
        self.t = T0 + t
        self.event(kind, **fields)
        return self

    def sample(self, kind: str, *, t: float = 0.0, **fields: Any) -> VerdictRecord:
        """Append one telemetry sample (``host``, ``gpu``, ``gpu_absent``, ...) at ``T0 + t``."""
        with self.record.telemetry_path.open("a") as f:
            f.write(json.dumps({"t": T0 + t, "kind": kind, **fields}) + "\n")
        return self

    def training(
        self, steps: int = 10, *, step_time: float = 1.0, start: float = 2.0, **per_step: Any
    ) -> VerdictRecord:
        """One successful attempt: attempt_start at ``start`` seconds, ``steps`` steps
        ``step_time`` seconds apart with ``per_step`` fields (samples, data_wait, ...),
        attempt_exit half a second after the last, exit.json."""
        self.attempts += 1
        n = self.attempts
        self.at(start, "attempt_start", attempt=n)
        for step in range(1, steps + 1):
            self.event("step", dt=step_time, attempt=n, step=step, step_time=step_time, **per_step)
        self.event("attempt_exit", dt=0.5, attempt=n, outcome="success")
        self.write_json(f"attempts/{n}/exit.json", {"attempt": n, "outcome": "success",
                        "reason": "exited 0", "duration_s": self.t - T0 - start})  # fmt: skip
        return self

    def preflight(self, *checks: tuple[str, bool, str], **details: dict[str, Any]) -> VerdictRecord:
        """preflight.json with checks ``(name, ok, message)``; ``details`` by check name."""
        self.write_json("preflight.json", {"checks": [
            {"name": n, "ok": ok, "message": m, "details": details.get(n, {})}
            for n, ok, m in checks
        ]})  # fmt: skip
        return self

    def compute(self) -> Verdict:
        """The verdict over the record as it is now."""
        return compute_verdict(self.record)

    def checks(self, name: str) -> list[Check]:
        """Every check of the verdict named ``name``."""
        return [c for c in self.compute().checks if c.name == name]

    def check(self, name: str) -> Check:
        """The one check named ``name`` (fails the test if there is none or several)."""
        found = self.checks(name)
        assert len(found) == 1, f"{len(found)} checks named {name!r}: {found}"
        return found[0]
