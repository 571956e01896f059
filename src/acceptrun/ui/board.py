"""What the board reads: the workspaces it shows, their runs from the index, thinned series.

Every page reads the records and the workspace index as they are on disk at the request;
nothing is cached between requests except the index itself (SQLite, rebuilt when
missing). The runs page reads the index only, plus the small ``verdict.json`` and
``ledger.json`` of the runs on the page shown, so it costs the same with 10 runs or
10,000.

>>> board = Board.for_workspaces([find_workspace()])
>>> page = board.runs(RunFilter(status="running"), page=1)
"""

from __future__ import annotations

import contextlib
import math
import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.units import finite_number
from acceptrun.errors import AcceptrunError, UserError, WorkspaceError
from acceptrun.record import liveness
from acceptrun.record.status import RUN_LIVE
from acceptrun.record.workspace import IndexRow, RunRecord, Workspace

__all__ = ["PAGE_SIZE", "Board", "RunFilter", "RunsPage", "thin_minmax", "thin_rows"]

PAGE_SIZE = 50  # runs per page of the runs list
# A run id as new_run_id makes them: never a path (no "/", no leading "."), never longer
# than a file name may be.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
LIVE_STATES = RUN_LIVE  # as acceptrun top has them
_COLUMNS = "run_id, name, status, verdict, mode, created_at, ended_at, duration_s, attempts, path"


@dataclass(frozen=True, slots=True)
class RunFilter:
    """The runs page's filters: a name substring, a status, a verdict, a date range (UTC)."""

    name: str = ""
    status: str = ""
    verdict: str = ""  # accepted | rejected | none (not decided yet) | "" (any)
    since: str = ""  # YYYY-MM-DD, inclusive
    until: str = ""  # YYYY-MM-DD, inclusive

    def where(self) -> tuple[str, list[Any]]:
        """The SQL ``WHERE`` clause (or "") and its parameters."""
        parts: list[str] = []
        params: list[Any] = []
        if self.name:
            parts.append("(name LIKE ? ESCAPE '\\' OR run_id LIKE ? ESCAPE '\\')")
            like = "%" + self.name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            params += [like + "%", like + "%"]
        if self.status:
            parts.append("status = ?")
            params.append(self.status)
        if self.verdict == "none":
            parts.append("verdict IS NULL")
        elif self.verdict:
            parts.append("verdict = ?")
            params.append(self.verdict)
        # created_at is ISO 8601 UTC, so dates compare as strings.
        if self.since:
            parts.append("created_at >= ?")
            params.append(_date(self.since, "since"))
        if self.until:
            parts.append("created_at < ?")
            params.append(_date(self.until, "until") + "T99")  # the whole day
        return (" WHERE " + " AND ".join(parts)) if parts else "", params


def _date(text: str, what: str) -> str:
    from datetime import date

    try:
        return date.fromisoformat(text.strip()).isoformat()
    except ValueError:
        raise UserError(f"{what}: {text!r} is not a date; give one like 2026-11-30") from None


@dataclass(frozen=True, slots=True)
class BoardRun:
    """One row of the runs list: the index row and where it lives on the board."""

    ws: int  # index of its workspace in Board.workspaces
    project: str
    row: IndexRow


@dataclass(slots=True)
class RunsPage:
    """One page of the runs list, newest first."""

    runs: list[BoardRun]
    total: int
    page: int
    pages: int
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Board:
    """The workspaces one ``acceptrun ui`` shows, each with the project it belongs to."""

    workspaces: tuple[tuple[str, Workspace], ...]
    notes: tuple[str, ...] = ()

    @classmethod
    def for_workspaces(cls, workspaces: Sequence[Workspace], notes: Sequence[str] = ()) -> Board:
        from acceptrun.record.registry import project_name

        return cls(tuple((project_name(w.root), w) for w in workspaces), tuple(notes))

    def workspace(self, ws: int) -> Workspace:
        if not 0 <= ws < len(self.workspaces):
            raise WorkspaceError(f"no workspace {ws} on this board (0..{len(self.workspaces) - 1})")
        return self.workspaces[ws][1]

    def record(self, ws: int, run_id: str) -> RunRecord:
        """A run by its exact id; never a path outside the workspace's runs directory."""
        workspace = self.workspace(ws)
        if not _RUN_ID.fullmatch(run_id):
            shown = repr(run_id[:40]) + ("…" if len(run_id) > 40 else "")
            raise WorkspaceError(
                f"run id: {shown} is not a run id (letters, digits, '.', '_', '-'; "
                "at most 128 characters); the runs page lists them"
            )
        path = workspace.runs_dir / run_id
        if path.is_symlink() or not (path / "run.json").is_file():  # a link is no run made here
            raise WorkspaceError(f"no run {run_id!r} in {workspace.root}; the runs page lists them")
        return RunRecord(path)

    def runs(self, flt: RunFilter, page: int = 1, size: int = PAGE_SIZE) -> RunsPage:
        """Runs matching ``flt`` over every workspace, newest first, one page of them.

        Each workspace's index answers with its first ``page * size`` rows at most;
        those are merged by run id (ids start with their UTC start time).
        """
        where, params = flt.where()
        page = max(1, page)
        want = page * size
        # One workspace: SQLite skips to the page. Several: each gives its first `want` rows.
        skip = (page - 1) * size if len(self.workspaces) == 1 else 0
        found: list[BoardRun] = []
        total = 0
        notes: list[str] = []
        for i, (project, ws) in enumerate(self.workspaces):
            try:
                with contextlib.closing(_open_index(ws)) as conn:
                    count = int(
                        conn.execute(f"SELECT COUNT(*) FROM runs{where}", params).fetchone()[0]
                    )
                    rows = conn.execute(
                        f"SELECT {_COLUMNS} FROM runs{where} ORDER BY run_id DESC LIMIT ? OFFSET ?",
                        [*params, want - skip, skip],
                    ).fetchall()
            except (sqlite3.Error, AcceptrunError, OSError) as exc:  # damaged: `index rebuild`
                notes.append(f"skipped {ws.root} ({project}): its index cannot be read: {exc}")
                continue
            total += count
            found += [BoardRun(i, project, IndexRow(*r)) for r in rows]
        found.sort(key=lambda r: r.row.run_id, reverse=True)
        pages = max(1, math.ceil(total / size))
        first = (page - 1) * size - skip
        return RunsPage(found[first : first + size], total, page, pages, notes)

    def statuses(self) -> list[str]:
        """The statuses present in the indexes, for the filter's choices."""
        out: set[str] = set()
        for _, ws in self.workspaces:
            with contextlib.suppress(sqlite3.Error, OSError):
                conn = _open_index(ws)
                with contextlib.closing(conn):
                    out |= {str(r[0]) for r in conn.execute("SELECT DISTINCT status FROM runs")}
        return sorted(out)


def _open_index(ws: Workspace) -> sqlite3.Connection:
    """The workspace's index, rebuilt first when it is missing (it is a cache of run.json)."""
    if what := ws.index_problem():  # a link, a FIFO: SQLite would follow it, or block
        raise sqlite3.DatabaseError(f"{ws.index_path} is {what}; `acceptrun index rebuild`")
    if not ws.index_path.exists():
        ws.rebuild_index()
    return sqlite3.connect(f"file:{ws.index_path}?mode=ro", uri=True, timeout=30)


# ---- what the runs list shows beside the index ----------------------------------------------


def failed_checks(record_path: Path) -> list[str]:
    """The required checks that did not pass, in words: ``name: evidence``."""
    from acceptrun._util.durable import read_json

    try:
        data = read_json(record_path / "verdict.json", root=record_path)
    except (OSError, ValueError, AcceptrunError):  # damaged, or a link: shown as unknown
        return []
    if not isinstance(data, dict):
        return []
    out = []
    for c in data.get("checks") or []:
        if isinstance(c, dict) and c.get("required") and c.get("status") != "pass":
            out.append(f"{c.get('name')}: {c.get('evidence')}")
    return out


def run_cost(record_path: Path) -> float | None:
    """The run's total in USD from its ledger.json as written at close; None when unpriced."""
    from acceptrun._util.durable import read_json

    try:
        data = read_json(record_path / "ledger.json", root=record_path)
    except (OSError, ValueError, AcceptrunError):  # damaged, or a link: shown as unknown
        return None
    if not isinstance(data, dict) or not data.get("priced"):
        return None
    total = data.get("total_usd")
    return float(total) if isinstance(total, int | float) else None


def is_live(record: RunRecord, state: dict[str, Any]) -> bool:
    """Whether the run is running now (record/liveness.py: its keeper's lease)."""
    try:
        return liveness.is_live(record, state)
    except Exception:  # a record that cannot tell is shown as not live, never an error page
        return False


# ---- thinning ---------------------------------------------------------------------------------


def thin_minmax(
    points: Sequence[tuple[float, float]], buckets: int = 700
) -> list[tuple[float, float]]:
    """At most ~2 points per x bucket: the lowest and the highest of each, in x order.

    A chart about ``buckets`` pixels wide then shows every spike and dip of 100,000 points
    with at most ``2 * buckets + 2`` of them, under the 1,500 at which the report's charts
    would drop every other point (:data:`acceptrun.report.svg.MAX_POINTS`). NaN y values
    (gaps between attempts) are kept.
    """
    if len(points) <= 2 * buckets:
        return list(points)
    xs = [x for x, _ in points]
    lo, hi = min(xs), max(xs)
    span = (hi - lo) or 1.0
    chosen: dict[int, tuple[int, int]] = {}  # bucket -> (index of min, index of max)
    keep: set[int] = {0, len(points) - 1}
    for i, (x, y) in enumerate(points):
        if math.isnan(y):
            keep.add(i)
            continue
        b = min(buckets - 1, int((x - lo) / span * buckets))
        if b not in chosen:
            chosen[b] = (i, i)
            continue
        imin, imax = chosen[b]
        if y < points[imin][1]:
            imin = i
        if y > points[imax][1]:
            imax = i
        chosen[b] = (imin, imax)
    for imin, imax in chosen.values():
        keep.update((imin, imax))
    return [points[i] for i in sorted(keep)]


def thin_rows(
    rows: list[dict[str, Any]], x: str, keys: Sequence[str], budget: int = 1400
) -> list[dict[str, Any]]:
    """Rows (step events) thinned like :func:`thin_minmax`, keeping each key's extremes.

    At most about ``budget`` rows stay, whichever key a chart draws from them.
    """
    if len(rows) <= budget:
        return rows
    buckets = max(50, budget // (2 * max(1, len(keys))))
    keep: set[int] = {0, len(rows) - 1}
    for key in keys:
        pts = [
            (float(r[x]), float(r[key]), i)
            for i, r in enumerate(rows)
            if finite_number(r.get(x)) is not None and finite_number(r.get(key)) is not None
        ]
        if not pts:
            continue
        by_point = {(px, py): i for px, py, i in pts}
        keep.update(by_point[p] for p in thin_minmax([(px, py) for px, py, _ in pts], buckets))
    # Attempt boundaries stay, so a chart still breaks its line where a restart happened.
    keep.update(
        i for i in range(1, len(rows)) if rows[i].get("attempt") != rows[i - 1].get("attempt")
    )
    return [rows[i] for i in sorted(keep)]
