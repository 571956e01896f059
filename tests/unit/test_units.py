"""One formatter per quantity: the figures users read in reports, verdicts and tables."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from acceptrun._util import units
from acceptrun.cli import tune as tune_cli
from acceptrun.cost import billing
from acceptrun.errors import UserError
from acceptrun.spec import model


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        pytest.param(None, "-", id="none"),
        pytest.param(0.0, "0.0s", id="zero"),
        pytest.param(4.24, "4.2s", id="tenths-under-10s"),
        pytest.param(9.94, "9.9s", id="just-under-10s"),
        pytest.param(42.4, "42s", id="whole-seconds"),
        pytest.param(59.4, "59s", id="under-a-minute"),
        pytest.param(60.0, "1m00s", id="one-minute"),
        pytest.param(185.0, "3m05s", id="minutes-seconds"),
        pytest.param(3599.4, "59m59s", id="under-an-hour"),
        pytest.param(3720.0, "1h02m", id="hours-minutes"),
        pytest.param(90000.0, "25h00m", id="past-a-day"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert units.format_duration(seconds) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        pytest.param(0, "0 B", id="zero"),
        pytest.param(1023, "1023 B", id="under-a-kib"),
        pytest.param(1536, "1.5 KiB", id="kib"),
        pytest.param(5 * 2**20, "5.0 MiB", id="mib"),
        pytest.param(3 * 2**30, "3.0 GiB", id="gib"),
        pytest.param(2**40, "1.0 TiB", id="tib"),
        pytest.param(2048 * 2**40, "2048.0 TiB", id="tib-is-the-last-unit"),
        pytest.param(-1536, "-1.5 KiB", id="negative-keeps-its-unit"),
    ],
)
def test_format_bytes_binary(n: int, text: str) -> None:
    assert units.format_bytes(n) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        pytest.param(999, "999 B", id="bytes"),
        pytest.param(3_400_000, "3.4 MB", id="mb"),
        pytest.param(1_500_000_000, "1.5 GB", id="gb"),
        pytest.param(2 * 10**12, "2.0 TB", id="tb"),
    ],
)
def test_format_bytes_decimal(n: int, text: str) -> None:
    assert units.format_bytes(n, decimal=True) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        pytest.param(1 << 30, "1 GiB", id="gib"),
        pytest.param(64 << 20, "64 MiB", id="mib"),
        pytest.param(4096, "4 KiB", id="kib"),
        pytest.param(1000, "1000 B", id="not-a-whole-kib"),
        pytest.param((1 << 20) + 1024, "1025 KiB", id="whole-kib-not-whole-mib"),
    ],
)
def test_format_bytes_exact(n: int, text: str) -> None:
    assert units.format_bytes_exact(n) == text


@pytest.mark.parametrize(
    ("usd", "text"),
    [
        pytest.param(0.0, "0.00", id="zero"),
        pytest.param(0.00833, "0.0083", id="under-a-dollar"),
        pytest.param(1.0, "1.00", id="a-dollar"),
        pytest.param(1234.567, "1,234.57", id="thousands"),
        pytest.param(-2.5, "-2.50", id="refund"),
    ],
)
def test_format_usd(usd: float, text: str) -> None:
    assert units.format_usd(usd) == text


@pytest.mark.parametrize(
    ("text", "n"),
    [
        pytest.param("4096", 4096, id="plain"),
        pytest.param("2GiB", 2 << 30, id="gib"),
        pytest.param("1.5G", 3 << 29, id="fraction"),
        pytest.param("500MB", 500 << 20, id="mb-is-binary"),
        pytest.param(" 8 k ", 8192, id="spaces-and-case"),
    ],
)
def test_parse_size(text: str, n: int) -> None:
    assert units.parse_size(text) == n


def test_parse_size_error_names_the_option_and_the_fix() -> None:
    with pytest.raises(
        UserError, match=r"--memory-limit: '2 parsecs' is not a size; write e\.g\. 512MiB"
    ):
        units.parse_size("2 parsecs", "--memory-limit")


def test_old_import_paths_are_the_shared_formatters() -> None:
    assert model.format_duration is units.format_duration
    assert billing.format_usd is units.format_usd
    assert billing.format_bytes is units.format_bytes
    assert tune_cli.parse_size is units.parse_size


@given(st.integers(min_value=0, max_value=2**50))
def test_format_bytes_exact_round_trips_through_parse_size(n: int) -> None:
    text = units.format_bytes_exact(n).replace(" ", "")
    assert units.parse_size(text) == n


@given(st.floats(min_value=60.0, max_value=3599.4))
def test_minutes_and_seconds_read_back_to_the_rounded_value(seconds: float) -> None:
    minutes, _, secs = units.format_duration(seconds).rstrip("s").partition("m")
    assert int(minutes) * 60 + int(secs) == round(seconds)


@given(st.floats(min_value=0.0, max_value=2.0**60, allow_nan=False))
def test_format_bytes_picks_the_largest_unit_below_tib(n: float) -> None:
    number, unit = units.format_bytes(n).split(" ")
    if unit != "TiB":  # 1023.96 KiB rounds to "1024.0 KiB": at most 1024 shown
        assert float(number) <= 1024
