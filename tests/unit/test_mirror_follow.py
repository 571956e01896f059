"""Mirror.follow and Mirror.drain_and_close: a store's commits and retention reach the mirror.

The path of ``run.checkpoint_store()`` (sharded saves): the store commits, its listener
queues the step and retires what retention deleted. Real store, real local mirror, the
mirror's real thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from acceptrun.checkpoint import CheckpointStore
from acceptrun.checkpoint.mirror import Mirror
from acceptrun.checkpoint.mirror_remote import remote_steps

Events = list[tuple[str, dict[str, Any]]]


def commit(store: CheckpointStore, step: int) -> None:
    writer = store.begin(step)
    writer.write_bytes("shard-0.bin", bytes([step]) * 1000)
    writer.write_bytes("shard-1.bin", bytes([step + 1]) * 500)
    writer.write_bytes("dcp-metadata.json", b'{"kind": "test"}\n')
    store.commit(writer)


def test_commits_are_mirrored_and_retention_applies_remotely(tmp_path: Path) -> None:
    events: Events = []
    url = str(tmp_path / "mirror" / "run1")
    mirror = Mirror(
        url, state_path=tmp_path / "mirror.json", on_event=lambda k, f: events.append((k, f))
    )
    mirror.start()
    store = CheckpointStore(tmp_path / "ckpt", keep_last=2)
    store.subscribe(mirror.follow)
    for step in (1, 2, 3, 4):
        commit(store, step)
    assert mirror.drain_and_close(timeout=60)
    assert remote_steps(url) == [3, 4]  # 1 and 2: deleted locally by retention, then remotely
    remote = CheckpointStore(url)
    assert all(remote.verify(s).ok for s in (3, 4))
    assert "mirror_behind" not in [k for k, _ in events]
    # Retention may delete step 1 or 2 locally before or while its upload runs (the
    # mirror thread's pace decides): that step is "skipped", the newer one supersedes it.
    skipped = {f["step"] for k, f in events if k == "mirror_failed"}
    assert all(f["state"] == "skipped" for k, f in events if k == "mirror_failed")
    uploaded = {f["step"] for k, f in events if k == "mirror_ok"}
    deleted = {f["step"] for k, f in events if k == "mirror_delete"}
    assert {3, 4} <= uploaded and skipped <= {1, 2} and not skipped & uploaded
    assert uploaded - {3, 4} <= deleted <= {1, 2}  # whatever went up was retired remotely


def _unreachable(tmp_path: Path, events: Events, retry_s: float) -> Mirror:
    """A started mirror whose root cannot be made (a file stands there), step 7 committed."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the mirror's directory should be")
    mirror = Mirror(
        str(blocker / "run1"),
        state_path=tmp_path / "mirror.json",
        on_event=lambda k, f: events.append((k, f)),
        retry_base_s=retry_s,
        retry_max_s=retry_s,
    )
    mirror.start()
    store = CheckpointStore(tmp_path / "ckpt")
    store.subscribe(mirror.follow)
    commit(store, 7)
    return mirror


def test_an_unreachable_mirror_reports_its_lag(tmp_path: Path) -> None:
    events: Events = []
    mirror = _unreachable(tmp_path, events, retry_s=30.0)
    assert not mirror.drain_and_close(timeout=0.05)  # it can never drain: the lag is recorded
    (behind,) = [f for k, f in events if k == "mirror_behind"]
    assert behind["status"]["7"]["state"] == "pending"


def test_a_failing_exit_stops_waiting_once_the_remote_failed(tmp_path: Path) -> None:
    """``while_healthy``: a dying workload's exit gives up at the first failed try (its next
    attempt uploads the rest) instead of waiting out the retries, which outlasted the hang
    window on a disk too full for the mirror too."""
    events: Events = []
    mirror = _unreachable(tmp_path, events, retry_s=600.0)
    # A hang guard, not a pace: without while_healthy this waits out its 600 s.
    assert not mirror.drain_and_close(timeout=600, while_healthy=True)
    failed = [f for k, f in events if k == "mirror_failed"]
    assert failed and failed[0]["state"] == "pending" and failed[0]["retry_in_s"] == 600.0
    (behind,) = [f for k, f in events if k == "mirror_behind"]
    assert behind["status"]["7"]["state"] == "pending"  # kept for the next attempt


def test_a_healthy_remote_is_waited_for_on_a_failing_exit_too(tmp_path: Path) -> None:
    url = str(tmp_path / "mirror" / "run1")
    mirror = Mirror(url, state_path=tmp_path / "mirror.json")
    mirror.start()
    store = CheckpointStore(tmp_path / "ckpt")
    store.subscribe(mirror.follow)
    commit(store, 3)
    assert mirror.drain_and_close(timeout=600, while_healthy=True)
    assert remote_steps(url) == [3]
