"""Data manifests on real files: snapshot, verify, manifest files, errors."""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path

import fsspec
import pytest

from acceptrun._util.hashing import hash_file
from acceptrun.capture.data import (
    Changed,
    format_verify,
    load_manifest,
    snapshot,
    verify,
    write_manifest,
)
from acceptrun.errors import DataError

TREE = {
    "train/shard-0.bin": bytes(range(256)) * 64,
    "train/shard-1.bin": b"\x00\xff" * 5000,
    "train/deep/er/notes.txt": b"nested three levels down\n",
    "val/empty.txt": b"",
    "README.md": b"# a small data set\n",
}


def make_tree(root: Path, files: dict[str, bytes] = TREE) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return root


def test_snapshot_of_a_tree_is_stable_and_independent_of_location(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data")
    first = snapshot(data)
    second = snapshot(str(data))
    copy = shutil.copytree(data, tmp_path / "elsewhere" / "copy")
    os.utime(copy / "README.md", (0, 0))  # mtimes must not matter

    assert first["root_hash"] == second["root_hash"] == snapshot(copy)["root_hash"]
    assert first["kind"] == "acceptrun.data-manifest" and first["schema"] == 1
    assert first["algorithm"] == "xxh3_128" and first["source"] == str(data)
    assert first["created_at"].endswith("Z")
    assert list(first["files"]) == sorted(TREE)
    assert first["count"] == len(TREE)
    assert first["total_bytes"] == sum(len(b) for b in TREE.values())
    assert first["files"]["val/empty.txt"]["size"] == 0
    shard = data / "train/shard-0.bin"
    assert first["files"]["train/shard-0.bin"]["hash"] == hash_file(shard)[0]


def test_snapshot_root_hash_changes_with_content_and_names(tmp_path: Path) -> None:
    base = snapshot(make_tree(tmp_path / "a"))["root_hash"]
    renamed = {**TREE, "README.txt": TREE["README.md"]}
    del renamed["README.md"]
    assert snapshot(make_tree(tmp_path / "b", renamed))["root_hash"] != base
    edited = {**TREE, "val/empty.txt": b"x"}
    assert snapshot(make_tree(tmp_path / "c", edited))["root_hash"] != base


def test_snapshot_of_a_single_file_uses_its_basename(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b'{"text": "hello"}\n' * 100)
    manifest = snapshot(path)
    assert list(manifest["files"]) == ["corpus.jsonl"]
    assert manifest["files"]["corpus.jsonl"] == {"size": 1800, "hash": hash_file(path)[0]}
    assert verify(path, manifest).ok


def test_fsspec_urls_agree_with_the_local_path(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data")
    local = snapshot(data)
    assert snapshot(data.as_uri())["root_hash"] == local["root_hash"]  # file://

    memory = fsspec.filesystem("memory")
    root = f"/acceptrun-test-{secrets.token_hex(4)}"
    try:
        for rel, content in TREE.items():
            memory.pipe(f"{root}/{rel}", content)
        url = f"memory://{root}"
        remote = snapshot(url)
        assert remote["files"] == local["files"]
        assert remote["root_hash"] == local["root_hash"]
        assert verify(url, local).ok
        single = snapshot(f"{url}/README.md")
        assert single["files"] == {"README.md": local["files"]["README.md"]}
        memory.pipe(f"{root}/val/empty.txt", b"now not empty")
        assert [c.path for c in verify(url, local).changed] == ["val/empty.txt"]
    finally:
        memory.rm(root, recursive=True)


def test_verify_ok(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data")
    manifest = snapshot(data)
    result = verify(data, manifest)
    assert result.ok
    assert result.root_hash == result.expected_root_hash == manifest["root_hash"]
    assert result.count == len(TREE)
    assert result.checked_bytes == manifest["total_bytes"]
    assert (result.missing, result.extra, result.changed) == ([], [], [])
    assert result.summary().startswith(f"{len(TREE)} files, ")
    assert "verified in" in result.summary()
    assert f"root {manifest['root_hash'][:17]}..." in result.summary()
    assert json.loads(json.dumps(result.to_dict()))["ok"] is True
    assert "matches its manifest" in format_verify(result)


def test_verify_names_missing_extra_and_changed_files(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data")
    manifest = snapshot(data)
    (data / "README.md").unlink()
    (data / "val/new.txt").write_bytes(b"surprise")
    shard = data / "train/shard-0.bin"
    flipped = bytearray(shard.read_bytes())
    flipped[100] ^= 0x01
    shard.write_bytes(bytes(flipped))  # same size, different content
    with open(data / "train/shard-1.bin", "r+b") as f:
        f.truncate(10)

    result = verify(data, manifest)
    assert not result.ok
    assert result.missing == ["README.md"]
    assert result.extra == ["val/new.txt"]
    assert [c.path for c in result.changed] == ["train/shard-0.bin", "train/shard-1.bin"]
    same_size, truncated = result.changed
    assert same_size.found_size == same_size.expected_size == 256 * 64
    assert same_size.found_hash is not None and same_size.found_hash != same_size.expected_hash
    assert truncated == Changed(
        "train/shard-1.bin", 10000, 10, manifest["files"]["train/shard-1.bin"]["hash"], None
    )
    assert result.root_hash is None  # extra and resized files were not read
    assert result.summary().startswith("1 missing, 1 extra, 2 changed: missing README.md;")
    json.dumps(result.to_dict())

    text = format_verify(result, manifest_path="m.json")
    assert "missing: README.md" in text
    assert "extra: val/new.txt" in text
    assert "changed: train/shard-1.bin (size 10000 -> 10)" in text
    assert "changed: train/shard-0.bin (size 16384 -> 16384, hash " in text
    assert text.splitlines()[-1] == (
        f"if the change is intended, refresh the manifest: acceptrun data snapshot {data} -o m.json"
    )


def test_verify_of_a_same_size_change_still_gives_a_root_hash(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data")
    manifest = snapshot(data)
    (data / "README.md").write_bytes(TREE["README.md"].upper())
    result = verify(data, manifest)
    assert not result.ok
    assert result.root_hash == snapshot(data)["root_hash"] != manifest["root_hash"]


def test_exclude_globs_skip_files_and_directories(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data")
    make_tree(data, {"scratch.tmp": b"x", "train/part.tmp": b"y", "cache/a/b.bin": b"z"})
    manifest = snapshot(data, exclude=["*.tmp", "cache/"])
    assert sorted(manifest["files"]) == sorted(TREE)
    assert manifest["root_hash"] == snapshot(make_tree(tmp_path / "clean"))["root_hash"]
    assert manifest["exclude"] == ["*.tmp", "cache/"]

    (data / "more.tmp").write_bytes(b"excluded files may come and go")
    assert verify(data, manifest).ok  # verify applies the manifest's own excludes


def test_manifest_inside_the_data_dir_is_ignored_when_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = make_tree(tmp_path / "data")
    inside = data / "data.manifest.json"
    write_manifest(inside, snapshot(data))
    manifest = load_manifest(inside)

    assert verify(data, manifest).extra == ["data.manifest.json"]
    assert verify(data, manifest, ignore=[str(inside)]).ok
    assert verify(data, manifest, ignore=["data.manifest.json"]).ok
    monkeypatch.chdir(tmp_path)
    assert verify("data", manifest, ignore=["data/data.manifest.json"]).ok


def test_write_and_load_manifest_round_trip(tmp_path: Path) -> None:
    manifest = snapshot(make_tree(tmp_path / "data"))
    path = tmp_path / "new" / "dir" / "data.manifest.json"
    write_manifest(path, manifest)
    assert load_manifest(path) == manifest
    assert not list(path.parent.glob(".*tmp*"))  # the atomic write left no temp file


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"{not json", "is not valid JSON", id="garbage"),
        pytest.param(b"[1, 2]", "is a JSON list, not an object", id="list"),
        pytest.param(
            b'{"kind": "acceptrun.checkpoint"}', "has kind 'acceptrun.checkpoint'", id="kind"
        ),
        pytest.param(b'{"kind": "acceptrun.data-manifest"}', "lacks key(s) schema", id="keys"),
    ],
)
def test_load_manifest_rejects_bad_files(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "m.json"
    path.write_bytes(content)
    with pytest.raises(DataError, match="acceptrun data snapshot") as info:
        load_manifest(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_load_manifest_rejects_an_edited_manifest(tmp_path: Path) -> None:
    manifest = snapshot(make_tree(tmp_path / "data"))
    manifest["files"]["README.md"]["size"] += 1
    path = tmp_path / "m.json"
    path.write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="does not match its files"):
        load_manifest(path)


def test_load_manifest_missing_says_how_to_create_it(tmp_path: Path) -> None:
    path = tmp_path / "absent.json"
    with pytest.raises(DataError) as info:
        load_manifest(path)
    assert str(info.value) == (
        f"data manifest {path} not found; "
        f"create it with `acceptrun data snapshot <data path> -o {path}`"
    )


def test_symlinks_are_followed(tmp_path: Path) -> None:
    outside = make_tree(tmp_path / "outside", {"big.bin": b"target bytes", "d/x": b"x"})
    data = make_tree(tmp_path / "data", {"a.txt": b"a"})
    (data / "link.bin").symlink_to(outside / "big.bin")
    (data / "linked-dir").symlink_to(outside / "d")
    manifest = snapshot(data)
    assert sorted(manifest["files"]) == ["a.txt", "link.bin", "linked-dir/x"]
    assert manifest["files"]["link.bin"]["hash"] == hash_file(outside / "big.bin")[0]


def test_broken_symlink_is_an_error_naming_it(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data")
    (data / "train/dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(DataError, match=r"dangling.*broken symlink"):
        snapshot(data)


def test_fifo_is_an_error_naming_it(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data")
    os.mkfifo(data / "pipe")
    with pytest.raises(DataError, match=r"pipe is not a regular file.*exclude=\['pipe'\]"):
        snapshot(data)
    assert snapshot(data, exclude=["pipe"])["count"] == len(TREE)


def test_symlink_loop_is_an_error(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data")
    (data / "train/loop").symlink_to(data)
    with pytest.raises(DataError, match="symlink loop"):
        snapshot(data)


@pytest.mark.parametrize("url", [False, True], ids=["path", "file-url"])
def test_missing_source_is_an_error(tmp_path: Path, url: bool) -> None:
    source = (tmp_path / "nope").as_uri() if url else str(tmp_path / "nope")
    with pytest.raises(DataError, match=r"does not exist; check the spec's data\.path"):
        snapshot(source)
    manifest = snapshot(make_tree(tmp_path / "data"))
    with pytest.raises(DataError, match="nope"):
        verify(source, manifest)


def test_missing_memory_url_is_an_error() -> None:
    with pytest.raises(DataError, match="memory://no-such-data does not exist"):
        snapshot("memory://no-such-data")


def test_unknown_algorithm_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown hash algorithm 'crc7'"):
        snapshot(make_tree(tmp_path / "data"), algorithm="crc7")


def test_other_algorithms_are_used_by_verify(tmp_path: Path) -> None:
    data = make_tree(tmp_path / "data")
    manifest = snapshot(data, algorithm="sha256")
    assert manifest["root_hash"].startswith("sha256:")
    assert verify(data, manifest).root_hash == manifest["root_hash"]


def test_progress_reaches_the_total(tmp_path: Path) -> None:
    # 9 MiB spans three 4 MiB chunks, so progress is reported more than once per file.
    data = make_tree(tmp_path / "data", {"big.bin": os.urandom(9 * 1024 * 1024), "b": b"bb"})
    calls: list[tuple[int, int]] = []
    manifest = snapshot(data, progress=lambda done, total: calls.append((done, total)))
    total = manifest["total_bytes"]
    assert len(calls) >= 3
    assert calls[-1] == (total, total)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)

    calls.clear()
    verify(data, manifest, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (total, total)


def test_progress_closes_for_an_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    calls: list[tuple[int, int]] = []
    manifest = snapshot(tmp_path / "empty", progress=lambda d, t: calls.append((d, t)))
    assert manifest["count"] == 0 and calls == [(0, 0)]
    assert verify(tmp_path / "empty", manifest).ok
