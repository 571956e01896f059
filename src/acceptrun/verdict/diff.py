"""``acceptrun diff RUN_A RUN_B``: did RUN_B reproduce RUN_A?

Compared, from the two records alone:

- provenance (the environment diff of ``acceptrun env diff``): context, listed, never a
  reason to fail;
- the data: the manifest's root hash each run verified against, and what it found;
- final metrics (the last value of each), within ``acceptance.tolerances`` of RUN_A's
  spec (absolute; a metric without a tolerance must match exactly);
- the loss curve: the largest absolute difference at the steps both runs logged (a step
  redone after a restart counts with its last value), within the ``"loss"`` tolerance;
- outputs: each registered output's content hash.

RUN_B *reproduced* RUN_A when the data is the same, every metric and the loss curve are
within tolerance, both registered the same outputs, and at least one thing about the
result was compared (a metric, a loss step or an output hash both runs have): two runs
with nothing in common reproduce nothing. It is *bitwise* when, besides, every output
hash, every metric and the loss at every step are exactly equal, and at least one output
hash or loss step was compared (equal metrics alone are not bytes). The conclusion names
what was compared and what was not.

>>> d = diff_runs(ws.get_run("a"), ws.get_run("b"))
>>> d.reproduced, d.bitwise
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from acceptrun.capture import provenance
from acceptrun.record.lost import lost_work
from acceptrun.record.steplog import StepLog
from acceptrun.record.view import read_attempts
from acceptrun.record.workspace import RunRecord
from acceptrun.verdict.core import record_failure

__all__ = ["LossCurve", "RunDiff", "diff_runs", "format_run_diff", "loss_curve"]

PROVENANCE_LINES = 15  # provenance changes shown in the text output; --json has them all


@dataclass(slots=True)
class RunDiff:
    """The comparison of two runs; ``differences`` names what keeps B from reproducing A."""

    a: str
    b: str
    provenance: list[provenance.Change]
    data: dict[str, Any]
    metrics: list[dict[str, Any]]
    loss: dict[str, Any] | None
    outputs: list[dict[str, Any]]
    differences: list[str] = field(default_factory=list)
    compared: dict[str, Any] = field(default_factory=dict)
    """What was compared: ``data`` (bool), and the ``metrics``, ``loss_steps`` and
    ``outputs`` both runs have."""
    notes: list[str] = field(default_factory=list)
    """What went wrong while comparing (run A's spec that no longer loads), one sentence each."""
    lost: dict[str, str] = field(default_factory=dict)
    """Each run's work lost to failures, as its record says it (record/lost.py), by run id."""

    @property
    def real_comparisons(self) -> int:
        """Metrics, loss steps and output hashes both runs have: the result compared."""
        return sum(int(self.compared.get(k, 0)) for k in ("metrics", "loss_steps", "outputs"))

    @property
    def reproduced(self) -> bool:
        return self.real_comparisons > 0 and not self.differences

    @property
    def bitwise(self) -> bool:
        if not self.reproduced:
            return False
        if not (self.compared.get("outputs") or self.compared.get("loss_steps")):
            return False  # equal metrics alone say nothing about the bytes
        exact_metrics = all(m["exact"] for m in self.metrics)
        exact_loss = self.loss is None or self.loss["max_abs_diff"] == 0.0
        exact_outputs = all(o["same"] for o in self.outputs)
        return exact_metrics and exact_loss and exact_outputs

    @property
    def what_was_compared(self) -> str:
        """``"1 metric, the loss at 30 steps and 1 output hash"``."""
        c = self.compared
        parts = []
        if c.get("metrics"):
            parts.append(f"{c['metrics']} metric{'s' if c['metrics'] != 1 else ''}")
        if c.get("loss_steps"):
            parts.append(f"the loss at {c['loss_steps']} step{'s' if c['loss_steps'] != 1 else ''}")
        if c.get("outputs"):
            parts.append(f"{c['outputs']} output hash{'es' if c['outputs'] != 1 else ''}")
        return " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)

    @property
    def not_compared(self) -> list[str]:
        """What could not be compared, and why (neither run has it, or only one does)."""
        out = []
        if not self.compared.get("metrics"):
            out.append(
                "metrics ("
                + ("no metric in common" if self.metrics else "neither run logged one")
                + ")"
            )
        if not self.compared.get("loss_steps"):
            out.append(
                "loss curve ("
                + ("no step logged by both runs" if self.loss else "neither run logged a loss")
                + ")"
            )
        if not self.compared.get("outputs"):
            out.append(
                "output hashes ("
                + ("no output in common" if self.outputs else "neither run registered an output")
                + ")"
            )
        if not self.compared.get("data"):
            out.append("data (neither run checked a data manifest)")
        return out

    @property
    def conclusion(self) -> str:
        if self.real_comparisons == 0:
            n = len(self.differences)
            tail = f"; {n} difference{'s' if n != 1 else ''}" if n else ""
            return (
                "nothing to compare: no metric, loss step or output hash is in both runs, "
                f"so nothing was reproduced{tail}"
            )
        if not self.reproduced:
            n = len(self.differences)
            return f"not reproduced: {n} difference{'s' if n != 1 else ''}"
        if self.bitwise:
            return f"reproduced within tolerance, bitwise: {self.what_was_compared} exactly equal"
        return f"reproduced within tolerance: compared {self.what_was_compared}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "reproduced": self.reproduced,
            "bitwise": self.bitwise,
            "conclusion": self.conclusion,
            "differences": self.differences,
            "compared": dict(self.compared),
            "not_compared": self.not_compared,
            "data": self.data,
            "metrics": self.metrics,
            "loss": self.loss,
            "outputs": self.outputs,
            "provenance": [{"path": c.path, "a": c.a, "b": c.b} for c in self.provenance],
            **({"notes": self.notes} if self.notes else {}),
            **({"lost": self.lost} if self.lost else {}),
        }


@dataclass(frozen=True)
class LossCurve:
    """A run's loss per step as two arrays: the steps (sorted, each once) and the losses.

    A step logged again by a later attempt keeps its last value. Read from the step log a
    chunk at a time; 16 bytes a logged loss, where dicts of the steps cost ten times that.
    """

    steps: np.ndarray[Any, Any]  # int64
    values: np.ndarray[Any, Any]  # float64

    def __len__(self) -> int:
        return int(self.steps.shape[0])

    def points(self) -> list[tuple[float, float]]:
        return list(zip(self.steps.astype(np.float64).tolist(), self.values.tolist(), strict=True))


def loss_curve(record: RunRecord) -> LossCurve:
    """Loss per step; a step logged again by a later attempt keeps its last value."""
    log = StepLog(record.path)
    size = log.count()
    steps, values = np.empty(size, dtype=np.int64), np.empty(size)
    n = 0
    for c in log.chunks():
        loss = c.values.get("loss")
        if loss is None or not len(c):
            continue
        keep = c.present["loss"]
        k = int(keep.sum())
        if n + k > steps.size:  # a format-1 record's steps are not in count()
            grow = max(n + k, 2 * steps.size)
            steps, values = np.resize(steps, grow), np.resize(values, grow)
        steps[n : n + k], values[n : n + k] = c.step[keep], loss[keep]
        n += k
    s, v = steps[:n], values[:n]
    if n < 2 or bool(np.all(s[1:] > s[:-1])):
        return LossCurve(s, v)  # written once each, in order: nothing to resolve
    # The last write of each step: the first of each in the reversed arrays.
    uniq, first = np.unique(s[::-1], return_index=True)
    return LossCurve(uniq, v[::-1][first])


BLOCK = 1 << 18  # steps of one curve compared at a time: the comparison's own memory


def _loss_compare(la: LossCurve, lb: LossCurve) -> tuple[int, int, int, float, int | None]:
    """Steps in both, only in a, only in b, the largest difference and its step.

    Equal values (NaN on both sides too) differ by 0; NaN on one side only by infinity.
    Both curves are sorted with each step once, so each block of ``a`` finds its steps in
    ``b`` by binary search: no temporary the size of the curves.
    """
    common, worst, at = 0, 0.0, None
    if len(lb):
        for lo in range(0, len(la), BLOCK):
            sa, va = la.steps[lo : lo + BLOCK], la.values[lo : lo + BLOCK]
            pos = np.minimum(np.searchsorted(lb.steps, sa), len(lb) - 1)
            hit = np.flatnonzero(lb.steps[pos] == sa)
            if not hit.size:
                continue
            common += int(hit.size)
            x, y = va[hit], lb.values[pos[hit]]
            with np.errstate(invalid="ignore"):
                delta = np.abs(x - y)
            delta[(x == y) | (np.isnan(x) & np.isnan(y))] = 0.0
            delta[np.isnan(delta)] = np.inf  # NaN on one side only
            i = int(np.argmax(delta))
            if float(delta[i]) > worst:  # the first step of the largest difference
                worst, at = float(delta[i]), int(sa[hit[i]])
    return common, len(la) - common, len(lb) - common, worst, at


def _final_metrics(record: RunRecord) -> dict[str, Any]:
    return {str(ev.get("name")): ev.get("value") for ev in record.events("metric")}


def _outputs(record: RunRecord) -> dict[str, dict[str, Any]]:
    return {str(ev.get("name")): ev for ev in record.events("output")}


def _data(record: RunRecord) -> dict[str, Any] | None:
    pre = record.read_json("preflight.json") or {}
    found = next((c for c in pre.get("checks", []) if c.get("name") == "data"), None)
    if found is None:
        return None
    details = found.get("details") or {}
    return {
        "source": details.get("source"),
        "manifest_root": details.get("expected_root_hash"),
        "found_root": details.get("root_hash"),
        "files": details.get("count"),
        "verified": bool(details.get("verified")),
    }


def _tolerances(record: RunRecord, notes: list[str]) -> dict[str, float]:
    """Run A's acceptance.tolerances; none (everything must match exactly) when its frozen
    spec no longer loads, which is recorded (``best_effort_failed``) and noted."""
    try:
        return dict(record.spec.acceptance.tolerances)
    except Exception as exc:  # recorded: the comparison goes on, exactly
        failed = record_failure(record, "diff: tolerances of run A", exc)
        notes.append(f"{failed}; every metric and the loss must match exactly")
        return {}


def _equal(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return bool(x == y)


def diff_runs(a: RunRecord, b: RunRecord) -> RunDiff:
    """Compare run ``b`` against run ``a`` (the original, whose tolerances apply)."""
    notes: list[str] = []
    tolerances = _tolerances(a, notes)
    differences: list[str] = []
    prov_a, prov_b = a.read_json("provenance.json"), b.read_json("provenance.json")
    changes = (
        provenance.diff(prov_a, prov_b)
        if isinstance(prov_a, dict) and isinstance(prov_b, dict)
        else []
    )
    data = _diff_data(a, b, differences)
    metrics, metrics_compared = _diff_metrics(a, b, tolerances, differences)
    loss = _diff_loss(a, b, float(tolerances.get("loss", 0.0)), differences)
    outputs = _diff_outputs(a, b, differences)
    compared: dict[str, Any] = {
        "data": data["a"] is not None and data["b"] is not None,
        "metrics": metrics_compared,
        "loss_steps": loss["common_steps"] if loss is not None else 0,
        "outputs": sum(o["a"] is not None and o["b"] is not None for o in outputs),
    }
    lost = {r.run_id: text for r in (a, b) if (text := _lost(r)) is not None}
    return RunDiff(
        a.run_id, b.run_id, changes, data, metrics, loss, outputs, differences, compared, notes,
        lost,
    )  # fmt: skip


def _limit(tol: float) -> str:
    """How a difference is judged: within ``tol``, or exactly when there is none."""
    return f"tolerance {tol:g}" if tol else "no tolerance: must match exactly"


def _diff_data(a: RunRecord, b: RunRecord, differences: list[str]) -> dict[str, Any]:
    """Both runs' data checks and whether they found the same data (its manifest root)."""
    data_a, data_b = _data(a), _data(b)
    data: dict[str, Any] = {"a": data_a, "b": data_b, "same": True}
    if not data_a and not data_b:
        return data
    root_a = (data_a or {}).get("manifest_root")
    root_b = (data_b or {}).get("manifest_root")
    if data_a is None or data_b is None:
        data["same"] = False
        differences.append(f"data: only run {a.run_id if data_a else b.run_id} checked its data")
    elif root_a != root_b:
        data["same"] = False
        differences.append(f"data: manifest root {root_a} vs {root_b}")
    elif data_a["found_root"] != data_b["found_root"]:
        data["same"] = False
        differences.append(
            f"data: the data found differs ({data_a['found_root']} vs {data_b['found_root']})"
        )
    return data


def _diff_metrics(
    a: RunRecord, b: RunRecord, tolerances: dict[str, float], differences: list[str]
) -> tuple[list[dict[str, Any]], int]:
    """A row per final metric of either run, judged against ``a``'s tolerance for it; and
    how many metrics both runs have."""
    metrics: list[dict[str, Any]] = []
    common = 0
    ma, mb = _final_metrics(a), _final_metrics(b)
    for name in sorted(set(ma) | set(mb)):
        common += name in ma and name in mb
        va, vb = ma.get(name), mb.get(name)
        tol = float(tolerances.get(name, 0.0))
        row: dict[str, Any] = {"name": name, "a": va, "b": vb, "tolerance": tol, "diff": None}
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (va, vb))
        if name not in ma or name not in mb:
            row.update(ok=False, exact=False)
            differences.append(f"metric {name}: only in run {a.run_id if name in ma else b.run_id}")
        elif numeric:
            delta = abs(float(va) - float(vb))  # type: ignore[arg-type]
            row["diff"] = delta
            ok = _equal(va, vb) or delta <= tol
            row.update(ok=ok, exact=_equal(va, vb))
            if not ok:
                differences.append(
                    f"metric {name}: {va!r} vs {vb!r}, off by {delta:.6g} ({_limit(tol)})"
                )
        else:
            same = _equal(va, vb)
            row.update(ok=same, exact=same)
            if not same:
                differences.append(f"metric {name}: {va!r} vs {vb!r}")
        metrics.append(row)
    return metrics, common


def _diff_loss(
    a: RunRecord, b: RunRecord, tol: float, differences: list[str]
) -> dict[str, Any] | None:
    """The loss curves compared on the steps both logged; None when neither logged one."""
    la, lb = loss_curve(a), loss_curve(b)
    if not len(la) and not len(lb):
        return None
    common, only_a, only_b, worst, at = _loss_compare(la, lb)
    loss = {
        "common_steps": common,
        "only_a": only_a,
        "only_b": only_b,
        "max_abs_diff": worst,
        "at_step": at,
        "tolerance": tol,
        "ok": bool(common) and worst <= tol and not only_a and not only_b,
    }
    if not common:
        differences.append("loss curve: no step logged by both runs")
        return loss
    if worst > tol:
        differences.append(
            f"loss curve: differs by up to {worst:.6g} at step {at} ({_limit(tol)}), "
            f"{common} steps compared"
        )
    if only_a or only_b:
        differences.append(
            f"loss curve: {only_a} steps only in run {a.run_id}, {only_b} only in run {b.run_id}"
        )
    return loss


def _diff_outputs(a: RunRecord, b: RunRecord, differences: list[str]) -> list[dict[str, Any]]:
    """A row per declared output of either run: its hash in each, and whether they match."""
    outputs: list[dict[str, Any]] = []
    oa, ob = _outputs(a), _outputs(b)
    for name in sorted(set(oa) | set(ob)):
        ha, hb = (oa.get(name) or {}).get("hash"), (ob.get(name) or {}).get("hash")
        outputs.append({"name": name, "a": ha, "b": hb, "same": ha is not None and ha == hb})
        if ha is None or hb is None:
            differences.append(f"output {name}: only in run {a.run_id if ha else b.run_id}")
    return outputs


def _lost(record: RunRecord) -> str | None:
    """The work a run's failures lost, as close wrote it in run.json (the same sum of its
    exit records before it closed); None when no attempt failed."""
    attempts = read_attempts(record)
    if all(x.get("outcome") == "success" for x in attempts):
        return None
    work = record.state.get("work")
    if isinstance(work, dict) and isinstance(work.get("lost"), str):
        return str(work["lost"])
    return lost_work(attempts).text()


def format_run_diff(d: RunDiff) -> str:
    """The conclusion first, then each comparison, then the environment's changes."""
    lines = [f"{d.b} vs {d.a}: {d.conclusion}"]
    for text in d.differences:
        lines.append(f"  differs  {text}")
    for run_id, text in d.lost.items():
        lines.append(f"  lost     run {run_id}: {text}")
    if d.data["a"] or d.data["b"]:
        root = (d.data["a"] or d.data["b"] or {}).get("manifest_root")
        lines.append(f"  data     {'same manifest ' + str(root) if d.data['same'] else 'differs'}")
    for m in d.metrics:
        if m["diff"] is None or not m["ok"]:  # a difference is listed above already
            continue
        mark = "equal" if m["exact"] else f"off by {m['diff']:.6g}"
        tol = f" (tolerance {m['tolerance']:g})" if m["tolerance"] else ""
        lines.append(f"  metric   {m['name']}: {m['a']!r} vs {m['b']!r}, {mark}{tol}")
    if d.loss:
        worst = d.loss["max_abs_diff"]
        lines.append(
            f"  loss     {d.loss['common_steps']} common steps, largest difference {worst:.6g}"
            + (f" at step {d.loss['at_step']}" if d.loss["at_step"] is not None else "")
        )
    for o in d.outputs:
        state = "same hash" if o["same"] else "different hash"
        lines.append(
            f"  output   {o['name']}: {state} ({str(o['a'])[:25]}... vs {str(o['b'])[:25]}...)"
        )
    if d.provenance:
        lines.append(
            f"  environment: {len(d.provenance)} change{'s' if len(d.provenance) != 1 else ''} (context, not a difference)"
        )
        for c in d.provenance[:PROVENANCE_LINES]:
            lines.append(f"    {provenance.format_diff([c])}")
        if len(d.provenance) > PROVENANCE_LINES:
            lines.append(f"    ... and {len(d.provenance) - PROVENANCE_LINES} more (--json)")
    else:
        lines.append("  environment: no differences")
    for text in d.not_compared:
        lines.append(f"  not compared: {text}")
    for text in d.notes:
        lines.append(f"  note: {text}")
    return "\n".join(lines)
