"""What a restart compares (capture/reverify.py): the data by stat signature then hash, the
packages by version. Real files in tmp_path; the probe subprocess is the integration
tests' (tests/integration/test_reverify.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from acceptrun.capture import data as datamod
from acceptrun.capture.reverify import compare_packages

LATER = time.time_ns() + 3600 * 10**9  # "now" an hour ahead: every file has settled


def _data(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"a" * 1000)
    (root / "sub" / "b.bin").write_bytes(b"b" * 2000)
    return root, datamod.snapshot(root)


def test_unchanged_files_are_trusted_by_their_stat_and_not_read(tmp_path: Path) -> None:
    root, manifest = _data(tmp_path)
    stats = datamod.stat_signatures(root, now_ns=LATER)
    assert stats is not None and sorted(stats) == ["a.bin", "sub/b.bin"]
    result = datamod.verify(root, manifest, trust=stats)
    assert result.ok and result.trusted == 2 and result.hashed == 0
    assert result.checked_bytes == 0  # not one byte read


def test_a_rewritten_file_of_the_same_size_is_hashed_and_named(tmp_path: Path) -> None:
    root, manifest = _data(tmp_path)
    stats = datamod.stat_signatures(root, now_ns=LATER)
    st = (root / "a.bin").stat()
    (root / "a.bin").write_bytes(b"A" + b"a" * 999)
    os.utime(root / "a.bin", ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime set back: ctime moves
    result = datamod.verify(root, manifest, trust=stats)
    assert not result.ok and result.trusted == 1 and result.hashed == 1
    (changed,) = result.changed
    assert changed.path == "a.bin" and changed.found_size == changed.expected_size == 1000
    assert changed.found_hash is not None and changed.found_hash != changed.expected_hash


def test_a_resized_file_is_named_without_reading_it(tmp_path: Path) -> None:
    root, manifest = _data(tmp_path)
    stats = datamod.stat_signatures(root, now_ns=LATER)
    (root / "sub" / "b.bin").write_bytes(b"b" * 10)
    result = datamod.verify(root, manifest, trust=stats)
    (changed,) = result.changed
    assert (changed.path, changed.found_size, changed.found_hash) == ("sub/b.bin", 10, None)


def test_a_file_changed_just_before_the_stat_is_not_trusted(tmp_path: Path) -> None:
    # Written a moment ago: a second write within the file system's clock tick could keep
    # the same times, so its signature is left out and a restart hashes it again.
    root, manifest = _data(tmp_path)
    stats = datamod.stat_signatures(root)
    assert stats == {}
    result = datamod.verify(root, manifest, trust=stats)
    assert result.ok and result.trusted == 0 and result.hashed == 2


def test_a_missing_and_an_added_file_are_named(tmp_path: Path) -> None:
    root, manifest = _data(tmp_path)
    stats = datamod.stat_signatures(root, now_ns=LATER)
    (root / "a.bin").unlink()
    (root / "c.bin").write_bytes(b"c")
    result = datamod.verify(root, manifest, trust=stats)
    assert result.missing == ["a.bin"] and result.extra == ["c.bin"] and not result.ok


def test_a_changed_version_is_named_with_both_versions() -> None:
    recorded = {"numpy": "2.0.1", "torch": "2.5.0", "gone": "1.0"}
    found = {"numpy": "2.1.0", "torch": "2.5.0", "new": "0.3"}
    assert compare_packages(recorded, found) == [
        "gone 1.0 -> (not installed)",
        "new (not installed) -> 0.3",
        "numpy 2.0.1 -> 2.1.0",
    ]
    assert compare_packages(recorded, dict(recorded)) == []


def test_damaged_signatures_trust_nothing_and_every_file_is_hashed(tmp_path: Path) -> None:
    """data_stats.json is a record file: any value in it is read as no signature, not an error."""
    root, manifest = _data(tmp_path)
    for bad in (5, "x", None, [], {"size": 1}, [1, 2, 3]):
        result = datamod.verify(root, manifest, trust={"a.bin": bad, "sub/b.bin": bad})
        assert result.ok and result.trusted == 0 and result.hashed == 2, bad
