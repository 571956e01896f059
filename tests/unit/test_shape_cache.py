"""The translated secret-shape rule set kept on disk is the live one, and a cache file
that does not hold (another key, a broken checksum, someone else's or a shared file, a
pattern RE2 refuses) is never used: the rules are read live instead.

The live translation reads detect-secrets' plugins here (``_translate``); the cached one
is written to and read back from ``$ACCEPTRUN_CACHE_DIR`` in ``tmp_path``. Both are
compiled into scanners, and each shape of tests/secret_shapes.py, in four quotings, and a
few texts that hold no secret, must come out of both the same.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import re2  # type: ignore[import-untyped]

from acceptrun._util import secret_shapes
from acceptrun._util.secret_shapes import SUPPLEMENTS, _Translation
from secret_shapes import SHAPES

QUOTINGS = (
    "{}",
    "ERROR upload failed ({}) after 3 tries",
    '{{"cause": "{}"}}',
    "ValueError: ('login failed', '{}')",
)
NOT_SECRETS = (
    "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "--token TOKEN --max-new-tokens 256",
    "run 20261207-171221-bert-squad-0b29 accepted",
    "a digest in capitals: UPPERCASEACCAB0123456789ABCDEF",
)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(secret_shapes.ENV_CACHE_DIR, str(tmp_path / "cache"))
    yield tmp_path / "cache"


@pytest.fixture(scope="module")
def live() -> _Translation:
    return secret_shapes._translate(re2)


def _hidden(scanner: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every planted text as the scanner hides it."""
    monkeypatch.setattr(secret_shapes, "_scanner", lambda: scanner)
    texts = [q.format(s.text) for s in SHAPES for q in QUOTINGS] + list(NOT_SECRETS)
    return [secret_shapes.hide_shapes(t) for t in texts]


def test_the_cached_rule_set_is_the_live_one(
    cache_dir: Path, live: _Translation, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = secret_shapes._cache_key()
    assert key is not None
    secret_shapes._write_cache(key, live)
    assert secret_shapes.cache_path() == cache_dir / "secret-shapes.json"
    assert cache_dir.joinpath("secret-shapes.json").stat().st_mode & 0o077 == 0
    cached = secret_shapes._read_cache(key)
    assert cached == live
    assert len(live.rules) > 40  # detect-secrets 1.5.0: 46 regex rules, 1 left out

    from_live, from_cache = secret_shapes._compiled(live, re2), secret_shapes._compiled(cached, re2)
    assert from_live is not None and from_cache is not None
    assert [(r.family, r.pattern, r.not_next_of) for r in from_cache.rules] == [
        (r.family, r.pattern, r.not_next_of) for r in from_live.rules
    ]
    assert len(from_cache.rules) == len(live.rules) + len(SUPPLEMENTS)
    assert from_cache.left_out == from_live.left_out
    by_live = _hidden(from_live, monkeypatch)
    by_cache = _hidden(from_cache, monkeypatch)
    assert by_cache == by_live
    # the comparison means something: most planted texts lose a credential by its shape
    assert sum("<redacted>" in out for out in by_cache) > len(SHAPES) * len(QUOTINGS) // 2
    assert by_cache[-len(NOT_SECRETS) :] == list(NOT_SECRETS)


def test_the_process_scanner_is_the_live_translation(live: _Translation) -> None:
    # Whatever this process read (the cache of the session, or the rules live).
    got = secret_shapes.taken()
    assert got == [(f, p) for f, p, _n, _o in live.rules] + [
        (s.family, s.pattern) for s in SUPPLEMENTS
    ]
    assert secret_shapes.left_out() == list(live.left_out)


def _rewrite(path: Path, change: Any) -> None:
    body = json.loads(path.read_text())
    change(body)
    path.write_text(json.dumps(body))


def _broken_pattern(body: dict[str, Any]) -> None:
    body["rules"][0][1] = "(?:"  # RE2 refuses it


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda p: _rewrite(p, lambda b: b.update(key="0" * 64)), id="another key"),
        pytest.param(lambda p: _rewrite(p, lambda b: b["rules"].pop()), id="a rule removed"),
        pytest.param(lambda p: _rewrite(p, lambda b: b.update(rules=[])), id="no rules"),
        pytest.param(lambda p: p.write_text("{not json"), id="garbage"),
        pytest.param(lambda p: p.write_text("[]"), id="not an object"),
        pytest.param(lambda p: os.chmod(p, 0o666), id="writable by others"),
        pytest.param(_broken_pattern, id="a pattern changed"),
    ],
)
def test_a_cache_that_does_not_hold_is_not_read(
    cache_dir: Path, live: _Translation, spoil: Any
) -> None:
    key = secret_shapes._cache_key()
    assert key is not None
    secret_shapes._write_cache(key, live)
    path = secret_shapes.cache_path()
    if spoil is _broken_pattern:
        _rewrite(path, spoil)
    else:
        spoil(path)
    assert secret_shapes._read_cache(key) is None


def test_a_checksummed_cache_that_re2_refuses_is_not_compiled(live: _Translation) -> None:
    family, _pattern, not_next, of = live.rules[0]
    bad = _Translation(((family, "(?:", not_next, of), *live.rules[1:]), live.left_out)
    assert secret_shapes._compiled(bad, re2) is None


def test_a_link_in_place_of_the_cache_is_not_followed(cache_dir: Path, live: _Translation) -> None:
    key = secret_shapes._cache_key()
    assert key is not None
    secret_shapes._write_cache(key, live)
    real = cache_dir / "elsewhere.json"
    secret_shapes.cache_path().rename(real)
    secret_shapes.cache_path().symlink_to(real)
    assert secret_shapes._read_cache(key) is None


def test_an_unwritable_cache_directory_is_no_error(
    tmp_path: Path, live: _Translation, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(secret_shapes.ENV_CACHE_DIR, str(blocker / "cache"))
    secret_shapes._write_cache("k", live)  # the directory cannot be made: nothing written
    assert secret_shapes._read_cache("k") is None
