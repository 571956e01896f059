"""The billing model and the price catalog, on crafted timelines (unix seconds)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from acceptrun.cost import (
    BILLING_MODES,
    Price,
    billed_seconds,
    check_budget,
    compute_cost,
    format_prices,
    load_catalog,
    monthly_storage_cost,
    price_for,
    storage_cost,
)
from acceptrun.errors import UserError
from acceptrun.spec.model import CostSpec

T0 = 1_790_000_000.0  # an arbitrary launch time, unix seconds
GIB = 1024**3


def make_price(
    billing: str = "per_minute", *, start_rule: str = "launch", per_hour: float = 3.6
) -> Price:
    increment_s, minimum_s = BILLING_MODES[billing]
    return Price(
        provider="test",
        instance="box",
        gpus=1,
        gpu="H100 SXM",
        price_per_hour=per_hour,
        increment_s=increment_s,
        minimum_s=minimum_s,
        start_rule=start_rule,
        storage_per_gib_month=0.2,
        source="test",
        date="2026-11-30",
    )


ENTRY = """
[[price]]
provider = "lambda"
instance = "gpu_1x_h100_sxm5"
gpus = 1
gpu = "H100 SXM"
price_per_hour = {price}
billing = "per_minute"
start_rule = "health_check"
source = "our contract"
date = "2026-12-01"
"""


# ---- billing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("billing", "ran_s", "billed_s"),
    [
        pytest.param("per_minute", 61.0, 120.0, id="per-minute-61s-bills-2-minutes"),
        pytest.param("per_minute", 60.0, 60.0, id="per-minute-exact"),
        pytest.param("per_minute", 1.0, 60.0, id="per-minute-1s"),
        pytest.param("per_second", 10.0, 60.0, id="per-second-minimum-60s"),
        pytest.param("per_second", 90.4, 91.0, id="per-second-rounds-up"),
        pytest.param("weekly", 3600.0, 604800.0, id="weekly-one-hour"),
        pytest.param("weekly", 604801.0, 1209600.0, id="weekly-just-over"),
    ],
)
def test_billed_seconds_rounds_up_to_increment(billing: str, ran_s: float, billed_s: float) -> None:
    assert billed_seconds(T0, T0 + ran_s, make_price(billing)) == billed_s


def test_billed_seconds_ignores_float_noise() -> None:
    # 0.1 + 0.2 style noise on timestamps must not bill an extra minute
    assert billed_seconds(T0 + 0.1, T0 + 0.1 + 120.0, make_price()) == 120.0


def test_health_check_start() -> None:
    price = make_price(start_rule="health_check")
    # launched at T0, healthy after 90 s, terminated 150 s after launch: 60 s billed
    assert billed_seconds(T0, T0 + 150.0, price, health_check_s=90.0) == 60.0
    assert billed_seconds(T0, T0 + 151.0, price, health_check_s=90.0) == 120.0
    # terminated before it passed health checks: nothing billed
    assert billed_seconds(T0, T0 + 80.0, price, health_check_s=90.0) == 0.0
    # start rule "launch" ignores the health-check time
    launch = make_price(start_rule="launch")
    assert billed_seconds(T0, T0 + 150.0, launch, health_check_s=90.0) == 180.0


@pytest.mark.parametrize("billing", list(BILLING_MODES))
def test_zero_length_run_bills_nothing(billing: str) -> None:
    price = make_price(billing)
    assert billed_seconds(T0, T0, price) == 0.0
    assert billed_seconds(T0, T0 - 5.0, price) == 0.0
    assert compute_cost(0.0, price) == 0.0


def test_compute_cost_usd() -> None:
    price = make_price(per_hour=3.78)
    assert compute_cost(billed_seconds(T0, T0 + 61.0, price), price) == pytest.approx(0.126)
    assert compute_cost(3600.0, price) == pytest.approx(3.78)


def test_storage_lambda_examples() -> None:
    # Lambda's billing page: 1000 GiB at 0.20 USD/GiB-month
    assert storage_cost(1000 * GIB, 720 * 3600.0, 0.20) == pytest.approx(200.00)
    assert round(storage_cost(1000 * GIB, 24 * 3600.0, 0.20), 2) == 6.67


def test_storage_rounds_up_to_hours() -> None:
    one_hour = storage_cost(720 * GIB, 3600.0, 1.0)
    assert one_hour == pytest.approx(1.0)
    assert storage_cost(720 * GIB, 1.0, 1.0) == pytest.approx(one_hour)
    assert storage_cost(720 * GIB, 3601.0, 1.0) == pytest.approx(2.0)
    assert storage_cost(720 * GIB, 0.0, 1.0) == 0.0


def test_monthly_storage_cost() -> None:
    assert monthly_storage_cost(1000 * GIB, 0.20) == pytest.approx(200.0)
    assert monthly_storage_cost(GIB // 2, 0.20) == pytest.approx(0.10)


# ---- catalog ---------------------------------------------------------------------------------


def test_packaged_catalog_loads_with_sources() -> None:
    catalog = load_catalog()
    assert {"lambda", "aws", "local"} <= set(catalog.providers())
    for price in catalog.entries:
        assert price.source, price.label
        assert price.date, price.label
    h100 = catalog.lookup("lambda", "gpu_1x_h100_sxm5")
    assert h100.label == "lambda:gpu_1x_h100_sxm5"
    assert (h100.price_per_hour, h100.increment_s, h100.start_rule) == (3.78, 60.0, "health_check")
    p5 = catalog.lookup("aws", "p5.48xlarge")
    assert (p5.gpus, p5.increment_s, p5.minimum_s) == (8, 1.0, 60.0)


@pytest.mark.parametrize(
    ("provider", "instance", "near"),
    [
        pytest.param("lamda", "gpu_1x_h100_sxm5", "'lambda'", id="provider-typo"),
        pytest.param("lambda", "gpu_1x_h100_sxn5", "'gpu_1x_h100_sxm5'", id="instance-typo"),
    ],
)
def test_lookup_typo_lists_near_match(provider: str, instance: str, near: str) -> None:
    with pytest.raises(UserError, match="did you mean") as info:
        load_catalog().lookup(provider, instance)
    assert near in str(info.value)
    assert "acceptrun cost prices" in str(info.value)


def test_workspace_override_changes_a_price(tmp_path: Path) -> None:
    (tmp_path / "prices.toml").write_text(ENTRY.format(price=2.50), encoding="utf-8")
    catalog = load_catalog(tmp_path)
    price = catalog.lookup("lambda", "gpu_1x_h100_sxm5")
    assert (price.price_per_hour, price.source) == (2.50, "our contract")
    # the other packaged entries are still there, once each
    assert catalog.lookup("lambda", "gpu_1x_a10").price_per_hour == 0.86
    assert len({p.label for p in catalog.entries}) == len(catalog.entries)


def test_workspace_without_override_uses_packaged(tmp_path: Path) -> None:
    assert len(load_catalog(tmp_path).entries) == len(load_catalog().entries)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        pytest.param("[[price]\nprovider =", "not valid TOML", id="syntax"),
        pytest.param(ENTRY.format(price='"cheap"'), "price_per_hour", id="wrong-type"),
        pytest.param(ENTRY.format(price=-1), "price_per_hour", id="negative"),
        pytest.param(
            ENTRY.format(price=1).replace("per_minute", "hourly"), "billing", id="billing"
        ),
        pytest.param(
            ENTRY.format(price=1).replace('date = "2026-12-01"', ""), "date", id="missing"
        ),
        pytest.param(ENTRY.format(price=1) + "colour = 1\n", "colour", id="unknown-field"),
    ],
)
def test_damaged_override_names_file_entry_field(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as info:
        load_catalog(tmp_path)
    message = str(info.value)
    assert str(path) in message
    assert words in message
    if words != "not valid TOML":
        assert "price[0] (lambda:gpu_1x_h100_sxm5)" in message


# ---- specs and budgets -----------------------------------------------------------------------


def test_price_for_price_per_hour_only() -> None:
    price = price_for(CostSpec(price_per_hour=1.25), load_catalog())
    assert price is not None
    assert (price.label, price.price_per_hour, price.source) == ("custom:custom", 1.25, "spec")
    assert (price.increment_s, price.start_rule, price.storage_per_gib_month) == (60.0, "launch", 0)


def test_price_for_provider_and_instance() -> None:
    price = price_for(CostSpec(provider="lambda", instance="gpu_1x_a100"), load_catalog())
    assert price is not None
    assert (price.price_per_hour, price.gpu, price.start_rule) == (
        1.48,
        "A100 40GB",
        "health_check",
    )


def test_price_for_spec_overrides_catalog_price() -> None:
    spec = CostSpec(provider="lambda", instance="gpu_1x_a100", price_per_hour=1.10)
    price = price_for(spec, load_catalog())
    assert price is not None
    assert (price.price_per_hour, price.source) == (1.10, "spec")
    assert (price.increment_s, price.start_rule) == (60.0, "health_check")  # rules kept


def test_price_for_nothing_and_half_named() -> None:
    assert price_for(CostSpec(), load_catalog()) is None
    with pytest.raises(UserError, match=r"cost\.instance: missing"):
        price_for(CostSpec(provider="lambda"), load_catalog())


def test_check_budget() -> None:
    h100 = load_catalog().lookup("lambda", "gpu_1x_h100_sxm5")  # 3.78 USD/h: 0.063 USD/min
    check_budget(h100, 0.07)
    check_budget(h100, None)
    check_budget(None, None)
    with pytest.raises(UserError, match=r"0\.05 USD.*0\.063 USD"):
        check_budget(h100, 0.05)
    with pytest.raises(UserError, match=r"set cost\.price_per_hour or cost\.provider/instance"):
        check_budget(None, 100.0)
    weekly = make_price("weekly", per_hour=1.0)  # one week = 168 USD
    with pytest.raises(UserError, match="604800 s"):
        check_budget(weekly, 100.0)


def test_format_prices_has_the_h100_line() -> None:
    table = format_prices(load_catalog())
    line = next(x for x in table.splitlines() if "gpu_1x_h100_sxm5" in x)
    assert "lambda" in line and "1x H100 SXM" in line and "3.78" in line
    assert "per minute" in line and "2026-05-07" in line
    header = table.splitlines()[0]
    # numbers are right-aligned under their heading
    assert line.index("3.78") + len("3.78") == header.index("USD/h") + len("USD/h")


def test_price_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="increment_s"):
        replace(make_price(), increment_s=0.0)
