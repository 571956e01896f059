"""``acceptrun bench scaling``: the same spec at 1, 2, ... processes, and how well it scales.

Each process count is a real, short ``acceptrun run`` of the spec (its own record, the
spec's name with ``-scaling-p<N>``): ``resources.processes = N``, at most ``--steps``
steps (``ACCEPTRUN_MAX_STEPS`` in the workload's environment), fresh checkpoints in the
record. Throughput is the median over the steady steps of rank 0's step events, in
samples/s when the workload logs ``samples`` (all ranks' samples of the step), else
steps/s. Efficiency is thr(N) / (N/B x thr(B)) for the smallest count B (1 by default):
1.0 is perfect linear scaling.

    $ acceptrun bench scaling examples/ddp/spec.toml --processes 1,2 --steps 200
    processes  throughput        efficiency  steps  run
            1  20714 samples/s         1.00    200  20261130-...-ddp-scaling-p1-3f0a
            2  21866 samples/s         0.53    200  20261130-...-ddp-scaling-p2-9b1c

Across nodes, inside a Slurm allocation of enough nodes, ``--layouts NODESxPROCESSES,...``
runs each layout (``resources.nodes`` x ``resources.processes``; a run of several nodes
is one srun step per attempt, docs/multi-node.md). Efficiency compares total processes
the same way, against the first layout: ``1x2,2x1`` says what crossing nodes costs::

    $ sbatch -N 2 --wrap "acceptrun bench scaling spec.toml --layouts 1x2,2x1 --steps 100"
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acceptrun._util.console import format_table, get_logger, quieted
from acceptrun.errors import UserError

__all__ = [
    "DEFAULT_STEPS",
    "ScalingPoint",
    "format_scaling",
    "parse_counts",
    "parse_layouts",
    "run_scaling",
]

_log = get_logger(__name__)

DEFAULT_STEPS = 50


@dataclass(frozen=True, slots=True)
class ScalingPoint:
    """One process count: its run and its median throughput."""

    processes: int
    run_id: str
    status: str  # the run's verdict, or why it produced no figure
    steps: int  # step events recorded
    throughput: float | None
    unit: str  # "samples/s" or "steps/s"
    efficiency: float | None = None
    nodes: int = 1  # machines; processes is the total over all of them

    @property
    def layout(self) -> str:
        """``"2x1"``: nodes x processes per node."""
        return f"{self.nodes}x{self.processes // self.nodes}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "processes": self.processes,
            "run_id": self.run_id,
            "status": self.status,
            "steps": self.steps,
            "throughput": self.throughput,
            "unit": self.unit,
            "efficiency": self.efficiency,
            "nodes": self.nodes,
        }


def parse_counts(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; raises UserError naming the bad item."""
    counts: list[int] = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) < 1:
            raise UserError(
                f"--processes {text!r}: {item!r} is not a process count; give counts of 1 or "
                "more separated by commas, e.g. --processes 1,2,4"
            )
        if int(item) not in counts:
            counts.append(int(item))
    return sorted(counts)


def parse_layouts(text: str) -> list[tuple[int, int]]:
    """``"1x2,2x1"`` -> ``[(1, 2), (2, 1)]`` (nodes, processes per node), in the order given."""
    layouts: list[tuple[int, int]] = []
    for item in text.split(","):
        nodes, sep, procs = item.strip().lower().partition("x")
        if not (sep and nodes.isdigit() and procs.isdigit() and int(nodes) and int(procs)):
            raise UserError(
                f"--layouts {text!r}: {item.strip()!r} is not NODESxPROCESSES; give layouts "
                "of 1 or more nodes and processes per node, e.g. --layouts 1x2,2x1"
            )
        if (int(nodes), int(procs)) not in layouts:
            layouts.append((int(nodes), int(procs)))
    return layouts


def run_scaling(
    spec_path: str | Path,
    counts: list[int],
    *,
    steps: int,
    workspace: str | Path | None = None,
    echo: bool = False,
    layouts: list[tuple[int, int]] | None = None,
) -> list[ScalingPoint]:
    """Run the spec once per process count and return the figures, smallest count first.

    ``layouts`` ((nodes, processes per node), in order) replaces ``counts``: a run of
    several nodes must start inside a Slurm allocation of as many. Each run's own lines
    (launch, preflight, attempts) are shown only with ``echo``.
    """
    from acceptrun.run.launch import launch
    from acceptrun.spec.model import load_spec
    from acceptrun.workload.contract import ENV_MAX_STEPS
    from acceptrun.workload.distributed import launch_command

    specs = []
    for nodes, n in layouts or [(1, c) for c in counts]:
        spec = load_spec(spec_path)
        spec.name = f"{spec.name}-scaling-" + (f"{nodes}x{n}" if layouts else f"p{n}")
        spec.resources.processes = n
        spec.resources.nodes = nodes
        spec.env[ENV_MAX_STEPS] = str(steps)
        spec.checkpoint.dir = None  # each run checkpoints into its own record
        launch_command(spec)  # a command torchrun cannot start: SpecError before any run
        specs.append((nodes, n, spec))
    points: list[ScalingPoint] = []
    with tempfile.TemporaryDirectory(prefix="acceptrun-scaling-") as tmp:
        for nodes, n, spec in specs:
            # The frozen form: absolute paths, so it loads the same from anywhere.
            path = Path(tmp) / f"{nodes}x{n}.toml"
            path.write_text(spec.to_toml())
            what = f"{nodes} node(s) x {n}" if layouts else f"{n}"
            _log.info(f"scaling: {what} process(es), at most {steps} steps")
            # Each run's own lines (launch, preflight) only with echo; warnings always.
            with contextlib.nullcontext() if echo else quieted():
                result = launch(path, workspace=workspace, echo=echo)
            status = "accepted" if result.verdict.accepted else "rejected"
            point = _point(nodes * n, result.record.run_id, result.record.path, status)
            points.append(dataclasses.replace(point, nodes=nodes))
    return with_efficiency(points)


def _point(n: int, run_id: str, run_dir: Path, status: str) -> ScalingPoint:
    rate, unit, count = median_throughput(run_dir)
    if rate is None:
        status = f"{status}; no timed step events"
    return ScalingPoint(n, run_id, status, count, rate, unit)


def median_throughput(run_dir: Path) -> tuple[float | None, str, int]:
    """(median rate, unit, steps recorded) of a run: samples/s when logged, else steps/s.

    Both come from the telemetry summary, one pass over the step log: the rate is the
    median over the steady steps, the count every step record, whatever the format.
    """
    from acceptrun.telemetry.summary import summarize

    summary = summarize(Path(run_dir))
    for unit in ("samples/s", "steps/s"):
        if summary.throughput.get(unit):
            return float(summary.throughput[unit]), unit, summary.steps
    return None, "steps/s", summary.steps


def with_efficiency(points: list[ScalingPoint]) -> list[ScalingPoint]:
    """Each point's efficiency against the smallest count: thr(N) / (N/B x thr(B))."""
    base = next((p for p in points if p.throughput), None)
    out = []
    for p in points:
        eff = None
        if base is not None and base.throughput and p.throughput and p.unit == base.unit:
            eff = p.throughput / (p.processes / base.processes * base.throughput)
        out.append(dataclasses.replace(p, efficiency=eff))
    return out


def format_scaling(points: list[ScalingPoint]) -> str:
    """The table ``acceptrun bench scaling`` prints."""
    rows: list[tuple[object, ...]] = []
    for p in points:
        thr = "-" if p.throughput is None else f"{p.throughput:.6g} {p.unit}"
        eff = "-" if p.efficiency is None else f"{p.efficiency:.2f}"
        rows.append((p.processes, thr, eff, p.steps, p.run_id, p.status))
    headers: tuple[str, ...] = ("processes", "throughput", "efficiency", "steps", "run", "verdict")
    if any(p.nodes > 1 for p in points):  # across nodes: say the layout of each run
        rows = [(p.layout, *row) for p, row in zip(points, rows, strict=True)]
        headers = ("nodes x procs", *headers)
    lines = [format_table(headers, rows, right={"processes", "efficiency", "steps"})]
    base = next((p for p in points if p.throughput), None)
    if base is not None:
        lines.append(
            f"efficiency = throughput / (processes / {base.processes} x throughput at "
            f"{base.processes}); 1.00 is linear scaling"
        )
    return "\n".join(lines)
