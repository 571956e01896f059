"""Results: the metrics and outputs the spec asks for, and a batch inference or serving
run's own checks.

For a script without the client that registered no output, what would let the verdict
check one.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from acceptrun._util.hashing import hash_file
from acceptrun.spec.model import parse_condition
from acceptrun.verdict.core import FAIL, NOT_RECORDED, PASS, Check, CheckInput

__all__ = ["black_box_outputs", "inference", "metrics", "outputs", "serving"]


def metrics(given: CheckInput) -> list[Check]:
    """The last value of each metric in acceptance.metrics meets its condition."""
    last: dict[str, Any] = {}
    events: dict[str, dict[str, Any]] = {}
    for ev in given.record.events("metric"):
        last[str(ev.get("name"))] = ev.get("value")
        events[str(ev.get("name"))] = ev
    out = []
    for name, text in given.spec.acceptance.metrics.items():
        cond = parse_condition(text)
        value = last.get(name)
        why = events.get(name, {}).get("per_attempt")
        if why:  # a framework's figure of one attempt (workload/aggregates.py): refused
            ev = events[name]
            shown = f"{value:.6g}" if isinstance(value, int | float) else str(value)
            instead = ev.get("instead") or "judge the run by a metric computed over the whole run"
            out.append(Check("results", f"metric {name}", FAIL, True,
                             f"refused as an acceptance metric: {shown} (attempt "
                             f"{ev.get('attempt')}) is {why}; a resumed run and an "
                             "uninterrupted one with the same weights report different values",
                             f"remove it from [acceptance.metrics] and {instead}"))  # fmt: skip
            continue
        if value is None:
            known = ", ".join(sorted(last)) or "none"
            out.append(Check("results", f"metric {name}", NOT_RECORDED, True,
                             f"never reported (metrics seen: {known})",
                             f'report it with run.metric("{name}", value)'))  # fmt: skip
            continue
        ok = isinstance(value, int | float) and math.isfinite(value) and cond.check(value)
        out.append(Check("results", f"metric {name}", PASS if ok else FAIL, True,
                         f"{value:.6g} {'meets' if ok else 'misses'} {cond}",
                         None if ok else "the run did not reach its target; see the loss curve"))  # fmt: skip
    return out


def outputs(given: CheckInput) -> list[Check]:
    """Each output in acceptance.outputs was registered and is unchanged since; the other
    registered or declared outputs too (information)."""
    registered: dict[str, dict[str, Any]] = {}
    missing: dict[str, dict[str, Any]] = {}  # declared ([outputs]) and not found, newest last
    for ev in given.record.events("output", "output_missing"):
        name = str(ev.get("name"))
        if ev["kind"] == "output":
            registered[name] = ev
            missing.pop(name, None)
        else:
            missing[name] = ev
            registered.pop(name, None)
    wanted = given.spec.acceptance.outputs
    out = []
    for name in wanted:
        found = registered.get(name)
        if found is None and name in missing:
            gone = missing[name]
            out.append(Check("results", f"output {name}", FAIL, True,
                             f"declared as {gone.get('pattern')!r} in [outputs], not found after "
                             f"attempt {gone.get('attempt')}: {gone.get('reason')}",
                             f"make the script write it, or fix [outputs] {name} in the spec"))  # fmt: skip
        elif found is None:
            out.append(Check("results", f"output {name}", NOT_RECORDED, True, "never registered",
                             f'register it with run.output("{name}", path), or declare it in [outputs]'))  # fmt: skip
        else:
            out.append(_verify_output(name, found))
    for name in sorted(set(registered) - set(wanted)):
        out.append(_verify_output(name, registered[name], required=False))
    for name in sorted(set(missing) - set(wanted)):
        out.append(Check("results", f"output {name}", FAIL, False,
                         f"declared in [outputs], not found: {missing[name].get('reason')}"))  # fmt: skip
    return out


def _verify_output(name: str, ev: dict[str, Any], *, required: bool = True) -> Check:
    """The registered file is still there with the hash it was registered with."""
    path = Path(str(ev.get("path")))
    if not path.is_file():
        return Check("results", f"output {name}", FAIL, required, f"{path} is gone",
                     "outputs must stay where they were registered, or use copy=True")  # fmt: skip
    digest, size = hash_file(path)
    if digest != ev.get("hash"):
        return Check("results", f"output {name}", FAIL, required,
                     f"{path} changed after it was registered ({ev.get('hash')} -> {digest})",
                     "register the output again after its last write")  # fmt: skip
    return Check(
        "results", f"output {name}", PASS, required, f"{path} ({_size(size)}, {digest[:25]}...)"
    )


def _size(n: float) -> str:
    """Bytes in decimal units: ``_size(1500) == "1.5 KB"``."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def black_box_outputs(given: CheckInput) -> list[Check]:
    """A script without the client that registered no output (information)."""
    what = given.black_box
    if what is None or given.spec.outputs or "output" in given.event_kinds():
        return []
    return [Check("results", "outputs", NOT_RECORDED, False,
                  f"not checked: {what} registered no output; declare its files in "
                  '[outputs] (e.g. model = "out/model.pt"), or call run.output(name, path)')]  # fmt: skip


def inference(given: CheckInput) -> list[Check]:
    """A batch inference run's coverage, error rate, items/s and cost per item (several groups)."""
    if not given.spec.inference.enabled:
        return []
    from acceptrun.inference.summary import batch_checks

    return [Check(*c) for c in batch_checks(given.record, given.spec)]


def serving(given: CheckInput) -> list[Check]:
    """A serving run's readiness, latency percentiles, TTFT, errors, goodput, cost per request."""
    if not given.spec.serving.enabled:
        return []
    from acceptrun.serving.summary import serving_checks

    return [Check(*c) for c in serving_checks(given.record, given.spec)]
