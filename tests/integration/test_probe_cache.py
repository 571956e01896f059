"""The provenance probe's cache: reused while the environment is unchanged, never after.

Each test runs the real probe subprocess under this interpreter, with a small stand-in
``torch`` package on PYTHONPATH so the facts (and their changes) are the test's own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from acceptrun.capture import provenance

PROBED = ("python", "packages", "torch")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("ACCEPTRUN_CACHE_DIR", str(directory))
    return directory / "probe"


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A folder on the probe's PYTHONPATH with a stand-in torch 9.9.0 and one distribution."""
    root = tmp_path / "site"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(
        "from .version import __version__\nclass version:\n    cuda = None\n"
    )
    (root / "torch" / "version.py").write_text('__version__ = "9.9.0"\n')
    add_distribution(root, "stand_in", "1.0")
    return root


def add_distribution(root: Path, name: str, version: str) -> None:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def capture(site: Path) -> dict[str, Any]:
    return provenance.capture(python=sys.executable, env={"PYTHONPATH": str(site)})


def test_an_unchanged_environment_is_read_from_the_cache_with_the_same_facts(
    cache: Path, site: Path
) -> None:
    first = capture(site)
    second = capture(site)

    assert first["probe"]["cached"] is False
    assert second["probe"]["cached"] is True
    assert second["probe"]["key"] == first["probe"]["key"]
    assert second["probe"]["captured_at"] == first["probe"]["captured_at"]
    assert first["torch"]["version"] == "9.9.0"
    for part in PROBED:
        assert second[part] == first[part]
        assert second["hashes"][part] == first["hashes"][part]
    assert [p.name for p in cache.iterdir()] == [f"probe-{first['probe']['key']}.json"]


def test_an_upgrade_an_install_or_another_device_list_is_probed_again(
    cache: Path, site: Path
) -> None:
    before = capture(site)
    (site / "torch" / "version.py").write_text('__version__ = "9.9.1"\n')
    upgraded = capture(site)
    add_distribution(site, "newcomer", "2.0")
    installed = capture(site)
    rewritten_metadata = site / "newcomer-2.0.dist-info" / "METADATA"
    rewritten_metadata.write_text("Metadata-Version: 2.1\nName: newcomer\nVersion: 2.0.post1\n")
    edited = capture(site)
    other_devices = provenance.capture(
        python=sys.executable, env={"PYTHONPATH": str(site), "CUDA_VISIBLE_DEVICES": "1"}
    )

    assert upgraded["probe"]["cached"] is False
    assert upgraded["torch"]["version"] == "9.9.1"
    assert installed["probe"]["cached"] is False
    assert installed["packages"]["list"]["newcomer"] == "2.0"
    assert edited["probe"]["cached"] is False
    assert edited["packages"]["list"]["newcomer"] == "2.0.post1"
    assert other_devices["probe"]["cached"] is False
    keys = {p["probe"]["key"] for p in (before, upgraded, installed, edited, other_devices)}
    assert len(keys) == 5
    assert provenance.diff(before, upgraded)  # the cache never hides a change


def test_a_damaged_cache_entry_is_probed_again_and_replaced(cache: Path, site: Path) -> None:
    first = capture(site)
    entry = cache / f"probe-{first['probe']['key']}.json"
    entry.write_text('{"key": "')  # cut off mid-write by someone else
    again = capture(site)
    third = capture(site)

    assert again["probe"]["cached"] is False
    assert again["torch"] == first["torch"]
    assert third["probe"]["cached"] is True


def test_the_cache_can_be_switched_off(
    cache: Path, site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEPTRUN_PROBE_CACHE", "0")
    first = capture(site)
    second = capture(site)

    assert first["probe"] == second["probe"] == {"cached": False}
    assert not cache.exists()


def test_an_unwritable_cache_says_so_and_the_facts_are_still_recorded(
    tmp_path: Path, site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would go\n")
    monkeypatch.setenv("ACCEPTRUN_CACHE_DIR", str(blocker))
    prov = capture(site)

    assert prov["probe"]["cached"] is False
    assert "could not keep the answer in" in prov["probe"]["error"]
    assert prov["torch"]["version"] == "9.9.0"
    assert os.path.isfile(blocker)
