"""The tune table, and the best configuration as a file a spec or a training script reads.

``--out best.toml`` (or ``.json``) holds a ``[tune]`` table (target, device, throughput,
gain) and a ``[config]`` table with the fields of :class:`~acceptrun.tune.target.TuneConfig`;
a training script loads it with :func:`read_best`::

    config = read_best("best.toml")      # a TuneConfig
    model = torch.compile(model, mode=config.compile) if config.compile else model
"""

from __future__ import annotations

import io
import json
import tomllib
from pathlib import Path
from typing import Any

from acceptrun._util.durable import write_atomic
from acceptrun.cost.billing import format_bytes
from acceptrun.errors import UserError
from acceptrun.tune.sweep import WARM_UP, TuneReport
from acceptrun.tune.target import TuneConfig

__all__ = ["format_table", "read_best", "table_rows", "write_best"]

COLUMNS = (
    "#",
    "axis",
    "config",
    "samples/s",
    "spread",
    "peak mem",
    "MFU",
    "gain",
    "numerics",
    "note",
)


def _note(trial: dict[str, Any]) -> str:
    if not trial["ok"]:
        return str(trial.get("error", "failed"))[:90]
    parts = []
    if "compile_s" in trial:
        parts.append(f"compile {trial['compile_s']:.1f} s")
        steps = trial.get("break_even_steps")
        parts.append(f"earned back after {steps} steps" if steps else "never earned back")
    if trial.get("overflow_steps"):
        parts.append(f"{trial['overflow_steps']} steps skipped (fp16 overflow)")
    if trial["axis"] == WARM_UP:
        parts.append("takes the machine's cold start; not compared")
    if trial.get("numerics") == "fail":
        parts.append(str(trial.get("numerics_detail", "")))
    return "; ".join(parts)


def table_rows(report: TuneReport) -> list[list[str]]:
    """One row of strings per trial, in :data:`COLUMNS` order; the best is marked ``*``."""
    rows = []
    for t in report.trials:
        mark = "*" if t["id"] == report.best else ""
        if t["ok"]:
            mfu = t.get("mfu")
            rows.append([
                f"{t['id']}{mark}", t["axis"], t["label"], f"{t['samples_per_s']:,.1f}",
                f"±{t['spread'] * 50:.1f}%", format_bytes(t["peak_memory_bytes"]),
                f"{mfu:.1%}" if mfu is not None else "-",
                f"{t['gain']:.2f}x" if t.get("gain") is not None else "-",
                t["numerics"], _note(t),
            ])  # fmt: skip
        else:
            rows.append([f"{t['id']}{mark}", t["axis"], t["label"], "failed", "-", "-", "-", "-", "-", _note(t)])  # fmt: skip
    return rows


def format_table(report: TuneReport, *, width: int = 160) -> str:
    """The trials as a Rich table, then the verdict lines; plain text (no colour codes)."""
    from rich.console import Console
    from rich.table import Table

    device = report.device
    title = f"acceptrun tune {report.name} on {device.get('device')} ({device.get('name')})"
    table = Table(title=title, title_justify="left")
    for col in COLUMNS:
        table.add_column(col, justify="right" if col in ("samples/s", "spread", "peak mem", "MFU", "gain") else "left",
                         overflow="fold")  # fmt: skip
    for row in table_rows(report):
        table.add_row(*row)
    buf = io.StringIO()
    # Labels, notes and errors come from the user's spec and trials: no markup, no emoji.
    console = Console(file=buf, width=width, no_color=True, highlight=False, soft_wrap=False,
                      markup=False, emoji=False)  # fmt: skip
    console.print(table)
    for note in report.notes:
        console.print(f"  {note}")
    console.print("  spread: half the interquartile range of the timed steps, in % of the median")
    base, best = report.trial(report.baseline), report.trial(report.best)
    if base is not None and not base["ok"]:
        console.print(f"the job's default failed: {base.get('error')}")
    elif best is not None and report.gain is not None:
        how = (
            "nothing beat it"
            if report.best == report.baseline
            else "timed back to back"
            if report.confirm
            else "from the sweep"
        )
        console.print(
            f"best: {best['label']}: {best['samples_per_s']:,.1f} samples/s in the sweep; "
            f"{report.gain:.2f}x the job's default ({_default_rate(report)}), {how}; "
            f"{len(report.trials)} trials in {report.seconds:.0f} s"
        )
    return buf.getvalue()


def _default_rate(report: TuneReport) -> str:
    """The default's label and the figure the gain divides by, each one measured warm."""
    base = report.trial(report.baseline)
    if base is None or not base["ok"]:
        return "-"
    text = f"{base['label']}, {base['samples_per_s']:,.1f} samples/s"
    text += " after a warm-up run" if report.warm_up is not None else ""
    again = report.trial(report.confirm[0]) if report.confirm else None
    if again is not None and again["ok"]:
        text += f"; {again['samples_per_s']:,.1f} again beside the best"
    return text


def _toml_value(value: Any) -> Any:
    return (
        {k: _toml_value(v) for k, v in value.items() if v is not None}
        if isinstance(value, dict)
        else value
    )


def write_best(path: str | Path, report: TuneReport) -> dict[str, Any]:
    """Write the best configuration to ``path`` (.toml or .json), atomically; returns it."""
    best = report.trial(report.best)
    if best is None:
        raise UserError(
            f"--out {path}: no trial succeeded, so there is no best configuration to write"
        )
    data = {
        "tune": {
            "target": report.target,
            "device": report.device.get("device"),
            "device_name": report.device.get("name"),
            "samples_per_s": round(best["samples_per_s"], 3),
            "gain": round(report.gain or 1.0, 4),
            "mfu": best.get("mfu"),
            "trial": best["id"],
        },
        "config": best["config"],
    }
    out = Path(path)
    if out.suffix == ".json":
        write_atomic(out, json.dumps(data, indent=2) + "\n")
    else:
        import tomli_w

        header = "# The best configuration found by `acceptrun tune`; read it with acceptrun.tune.read_best().\n"
        write_atomic(out, header + tomli_w.dumps(_toml_value(data)))
    return data


def read_best(path: str | Path) -> TuneConfig:
    """The :class:`TuneConfig` in a file written by ``acceptrun tune --out``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(
            f"{p}: cannot read the tune result ({exc.strerror}); run `acceptrun tune --out {p}`"
        ) from exc
    try:
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{p}: not a tune result ({exc})") from exc
    config = data.get("config")
    if not isinstance(config, dict):
        raise UserError(f"{p}: no [config] table; it was not written by `acceptrun tune --out`")
    return TuneConfig.from_dict(config)
