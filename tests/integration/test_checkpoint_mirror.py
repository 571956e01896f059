"""Checkpoint mirror: uploads to a real S3-compatible server (moto on loopback), fetch on a
fresh machine, corruption on either side, an outage in the middle of a run, and plain
local-path and memory:// mirrors."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fsspec
import pytest

from acceptrun._util.durable import read_json
from acceptrun.checkpoint.mirror import Mirror
from acceptrun.checkpoint.mirror_remote import fetch, remote_steps
from acceptrun.errors import RecordError, UserError
from builders import assert_same_checkpoint, make_checkpoint, tree

if TYPE_CHECKING:
    from s3server import S3Server

# The S3 fixtures (tests/integration/s3server.py, on sys.path through pytest's pythonpath).
pytest_plugins = ["s3server"]
BUCKET = "acceptrun-test"  # s3server.BUCKET; importing it here would defeat assert rewriting

Events = list[tuple[str, dict[str, Any]]]


def s3_url(name: str) -> str:
    return f"s3://{BUCKET}/{name}-{secrets.token_hex(3)}/checkpoints"


def recorder(events: Events) -> Callable[[str, dict[str, Any]], None]:
    return lambda name, payload: events.append((name, payload))


def test_upload_to_s3_writes_data_then_manifest_then_latest(
    s3: dict[str, Any], tmp_path: Path
) -> None:
    # A 6 MiB file with a 5 MiB block size goes up as a multipart upload, as a big one would.
    options = {**s3["storage_options"], "default_block_size": 5 * 2**20}
    url = s3_url("upload")
    ckpt = tmp_path / "ckpt"
    files = {
        "model.safetensors": secrets.token_bytes(6 * 2**20),
        "optim/state.bin": secrets.token_bytes(1000),
    }
    step_dir = make_checkpoint(ckpt, 10, files)
    events: Events = []
    mirror = Mirror(
        url, state_path=tmp_path / "mirror.json", storage_options=options, on_event=recorder(events)
    )
    mirror.start()
    mirror.enqueue(10, step_dir)
    assert mirror.wait(timeout=120)
    mirror.close()

    fs, root = fsspec.url_to_fs(url, **options)
    fs.invalidate_cache()
    listed = sorted(p.removeprefix(root + "/") for p in fs.find(root))
    assert listed == [
        "LATEST",
        "step-10/MANIFEST.json",
        "step-10/model.safetensors",
        "step-10/optim/state.bin",
    ]
    assert fs.cat_file(f"{root}/LATEST") == b"step-10\n"
    assert fs.cat_file(f"{root}/step-10/MANIFEST.json") == (step_dir / "MANIFEST.json").read_bytes()

    # The order of writes as the server saw them: every data file (PUT, or the POST that
    # completes a multipart upload) before the manifest, the manifest before LATEST.
    server: S3Server = s3["server"]
    writes = [key for method, key in server.requests() if method in ("PUT", "POST")]
    prefix = f"{BUCKET}/{root.split('/', 1)[1]}/"
    writes = [key.removeprefix(prefix) for key in writes if key.startswith(prefix)]
    last = {key: i for i, key in enumerate(writes)}
    assert last["step-10/model.safetensors"] < last["step-10/MANIFEST.json"]
    assert last["step-10/optim/state.bin"] < last["step-10/MANIFEST.json"]
    assert last["step-10/MANIFEST.json"] < last["LATEST"]
    assert writes.count("step-10/MANIFEST.json") == 1

    state = read_json(tmp_path / "mirror.json")["steps"]["10"]
    total = sum(len(b) for b in files.values()) + (step_dir / "MANIFEST.json").stat().st_size
    assert (state["state"], state["attempts"], state["bytes"]) == ("ok", 1, total)
    assert [name for name, _ in events] == ["mirror_ok"]
    assert events[0][1]["step"] == 10 and events[0][1]["bytes"] == total


def test_fetch_on_a_fresh_machine_restores_latest_or_a_given_step(
    s3: dict[str, Any], tmp_path: Path
) -> None:
    url, options = s3_url("fetch"), s3["storage_options"]
    ckpt = tmp_path / "ckpt"
    mirror = Mirror(url, state_path=tmp_path / "mirror.json", storage_options=options)
    for step in (10, 20):
        mirror.upload(step, make_checkpoint(ckpt, step))
    assert remote_steps(url, storage_options=options) == [10, 20]

    fresh = tmp_path / "fresh-machine" / "checkpoints"  # does not exist yet
    restored = fetch(url, fresh, storage_options=options)
    assert restored == fresh / "step-20"
    assert_same_checkpoint(ckpt / "step-20", restored)
    assert (fresh / "LATEST").read_text() == "step-20\n"
    assert sorted(p.name for p in fresh.iterdir()) == ["LATEST", "step-20"]  # no staging left

    older = fetch(url, tmp_path / "other", step=10, storage_options=options)
    assert_same_checkpoint(ckpt / "step-10", older)
    assert (tmp_path / "other" / "LATEST").read_text() == "step-10\n"

    with pytest.raises(UserError, match=r"step 30 is not in the mirror.*\[10, 20\]"):
        fetch(url, tmp_path / "none", step=30, storage_options=options)
    assert not (tmp_path / "none").exists()


def test_local_corruption_after_commit_is_never_mirrored(
    s3: dict[str, Any], tmp_path: Path
) -> None:
    url, options = s3_url("local-corrupt"), s3["storage_options"]
    step_dir = make_checkpoint(tmp_path / "ckpt", 7)
    weights = step_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[1234] ^= 0xFF  # bit rot: same size, different bytes
    weights.write_bytes(bytes(data))
    events: Events = []
    mirror = Mirror(
        url, state_path=tmp_path / "mirror.json", storage_options=options, on_event=recorder(events)
    )
    mirror.start()
    mirror.enqueue(7, step_dir)
    assert mirror.wait(timeout=120) is False
    mirror.close()

    state = read_json(tmp_path / "mirror.json")["steps"]["7"]
    assert state["state"] == "failed"
    assert "step-7/model.safetensors does not match its manifest" in state["reason"]
    assert events[-1][0] == "mirror_failed" and events[-1][1]["state"] == "failed"
    fs, root = fsspec.url_to_fs(url, **options)
    fs.invalidate_cache()
    assert not fs.exists(f"{root}/step-7/MANIFEST.json")
    assert not fs.exists(f"{root}/step-7/model.safetensors")
    assert not fs.exists(f"{root}/LATEST")
    assert remote_steps(url, storage_options=options) == []

    # The synchronous path says the same, as an error naming the file.
    with pytest.raises(RecordError, match=r"step-7/model\.safetensors"):
        mirror.upload(7, step_dir)


def test_corrupt_remote_copy_fails_fetch_and_leaves_dest_untouched(
    s3: dict[str, Any], tmp_path: Path
) -> None:
    url, options = s3_url("remote-corrupt"), s3["storage_options"]
    mirror = Mirror(url, state_path=tmp_path / "mirror.json", storage_options=options)
    local = make_checkpoint(tmp_path / "ckpt", 3)
    mirror.upload(3, local)

    # Someone (or bit rot in the store) overwrites one object: same size, other bytes.
    key = f"{url.removeprefix(f's3://{BUCKET}/')}/step-3/optim/state.bin"
    size = (local / "optim" / "state.bin").stat().st_size
    server: S3Server = s3["server"]
    server.client().put_object(Bucket=BUCKET, Key=key, Body=b"\0" * size)

    dest = tmp_path / "restore"
    make_checkpoint(dest, 1)  # what the machine already had
    before = tree(dest)
    with pytest.raises(RecordError, match=r"step-3/optim/state\.bin is corrupt"):
        fetch(url, dest, storage_options=options)
    assert tree(dest) == before
    assert sorted(p.name for p in dest.iterdir()) == ["LATEST", "step-1"]

    with pytest.raises(RecordError, match=r"state\.bin"):
        fetch(url, tmp_path / "fresh", storage_options=options)
    assert not (tmp_path / "fresh").exists()


def test_outage_queues_steps_and_catches_up_newest_first(
    s3_restartable: S3Server, tmp_path: Path, poll: Callable[..., Any]
) -> None:
    server = s3_restartable
    # One connection attempt per call: botocore's default of 5 attempts with backoff makes
    # each failed call take ~10 s, which is fine for a real run but slow for a test.
    options = {
        **server.storage_options,
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2},
    }
    url = s3_url("outage")
    ckpt = tmp_path / "ckpt"
    state_path = tmp_path / "mirror.json"
    events: Events = []
    mirror = Mirror(
        url,
        state_path=state_path,
        storage_options=options,
        on_event=recorder(events),
        retry_base_s=0.2,
        retry_max_s=1.0,
    )
    mirror.start()
    server.stop()

    for step in (100, 200):  # training goes on while the remote is down
        step_dir = make_checkpoint(ckpt, step)
        # enqueue returns at once: it never waits for the remote, whose retries cannot
        # succeed while it is down (the bound is only there to fail rather than hang).
        started = time.monotonic()
        mirror.enqueue(step, step_dir)
        assert time.monotonic() - started < 30

    def both_pending_with_reason() -> bool:
        steps = read_json(state_path)["steps"] if state_path.exists() else {}
        return all(
            steps.get(s, {}).get("state") == "pending" and "connect" in steps[s]["reason"].lower()
            for s in ("100", "200")
        )

    poll(both_pending_with_reason, timeout=120, what="both steps pending with a reason")
    # The event follows the state file write on the mirror thread: poll, do not race it.
    poll(
        lambda: any(name == "mirror_failed" and p["state"] == "pending" for name, p in events),
        timeout=120,
        what="a mirror_failed event for the outage",
    )
    assert mirror.wait(timeout=0.5) is False

    server.start()  # same port, comes back empty: the bucket is made again
    assert mirror.wait(timeout=120)
    mirror.close()

    assert remote_steps(url, storage_options=options) == [100, 200]
    fs, root = fsspec.url_to_fs(url, **options)
    assert fs.cat_file(f"{root}/LATEST") == b"step-200\n"  # the older catch-up did not move it
    status = mirror.status()
    assert all(status[s]["state"] == "ok" for s in (100, 200))
    assert max(status[s]["attempts"] for s in (100, 200)) >= 2
    manifests = [
        key
        for method, key in server.requests()
        if method == "PUT" and key.endswith("MANIFEST.json")
    ]
    assert [m.split("/")[-2] for m in manifests] == ["step-200", "step-100"]  # newest first
