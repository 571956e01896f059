"""The price catalog: what an instance costs and how its provider bills it.

The packaged ``prices.toml`` holds list prices with their source and the date they were
read; a workspace's own ``prices.toml`` (same format) overrides or adds entries by
(provider, instance). A spec names its machine with ``cost.provider``/``cost.instance``
or gives ``cost.price_per_hour`` directly::

    catalog = load_catalog(workspace_root)
    price = price_for(spec.cost, catalog)          # Price | None
    check_budget(price, spec.limits.budget_usd)    # UserError before launch if hopeless
"""

from __future__ import annotations

import difflib
import os
import tomllib
from dataclasses import dataclass, replace
from importlib.resources import files
from pathlib import Path
from typing import ClassVar

from acceptrun._util.durable import read_bytes_bounded
from acceptrun.errors import UnsafeFileError, UserError
from acceptrun.spec.fields import build, check_fields
from acceptrun.spec.load import MAX_TOML_BYTES, loads_toml, toml_error
from acceptrun.spec.model import CostSpec, doc

__all__ = [
    "BILLING_MODES",
    "START_RULES",
    "Catalog",
    "Price",
    "PriceEntry",
    "check_budget",
    "format_prices",
    "load_catalog",
    "price_for",
]

# billing mode -> (increment in seconds, minimum billed in seconds when anything ran)
BILLING_MODES: dict[str, tuple[float, float]] = {
    "per_minute": (60.0, 0.0),
    "per_second": (1.0, 60.0),
    "weekly": (604800.0, 0.0),
}
START_RULES = ("health_check", "launch")
PRICES_FILE = "prices.toml"


@dataclass(frozen=True, kw_only=True)
class PriceEntry:
    """One ``[[price]]`` table of a ``prices.toml``, as written (declared like the spec)."""

    provider: str = doc("Provider, as it spells itself, e.g. lambda.", pattern=r"\S")
    instance: str = doc("Instance type, as the provider spells it.", pattern=r"\S")
    gpus: int = doc("GPUs in the instance; 0: none.", ge=0)
    gpu: str | None = doc("GPU model, e.g. H100; absent: no GPU.", None)
    price_per_hour: float = doc("On-demand price of the whole instance.", ge=0, unit="USD per hour")
    billing: str = doc(
        "How billed time is rounded: per_minute, per_second (60 s minimum) or weekly.",
        choices=tuple(BILLING_MODES),
    )
    start_rule: str = doc(
        "When billing starts: health_check (the instance passed them) or launch.",
        choices=START_RULES,
    )
    storage_per_gib_month: float = doc(
        "Attached filesystem price; 0: none.", 0.0, ge=0, unit="USD per GiB-month"
    )
    minimum_s: float | None = doc(
        "Seconds billed at least when anything ran; default: the billing mode's.",
        None,
        ge=0,
        unit="seconds",
    )
    source: str = doc("Where the figures come from.")
    date: str = doc("When they were read, e.g. 2026-12-01.")

    def __post_init__(self) -> None:
        check_fields(self, "")

    def price(self) -> Price:
        """The entry with its billing mode resolved to increments."""
        increment_s, minimum_s = BILLING_MODES[self.billing]
        # A provider whose minimum differs from its mode's (AWS Windows: none; some: 10 min).
        return Price(
            provider=self.provider,
            instance=self.instance,
            gpus=self.gpus,
            gpu=self.gpu,
            price_per_hour=self.price_per_hour,
            increment_s=increment_s,
            minimum_s=minimum_s if self.minimum_s is None else self.minimum_s,
            start_rule=self.start_rule,
            storage_per_gib_month=self.storage_per_gib_month,
            source=self.source,
            date=self.date,
        )


@dataclass(frozen=True, kw_only=True)
class Price:
    """One instance's price and billing rules, e.g. ``lambda:gpu_1x_h100_sxm5`` at 3.78 USD/h."""

    SECTION: ClassVar[str] = "price"

    provider: str = doc("Provider name; custom for a spec's own price.")
    instance: str = doc("Instance type; custom for a spec's own price.")
    gpus: int = doc("GPUs in the instance.", ge=0)
    gpu: str | None = doc("GPU model; None: no GPU.")
    price_per_hour: float = doc("Price of the whole instance.", ge=0, unit="USD per hour")
    increment_s: float = doc("Billed time is rounded up to this.", gt=0, unit="seconds")
    minimum_s: float = doc("Billed at least this when anything ran.", ge=0, unit="seconds")
    start_rule: str = doc("When billing starts.", choices=START_RULES)
    storage_per_gib_month: float = doc(
        "Filesystem price; 0 when none.", ge=0, unit="USD per GiB-month"
    )
    source: str = doc("Where the price comes from (spec: the spec's own).")
    date: str = doc("When the price was read.")

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)

    @property
    def label(self) -> str:
        """``"lambda:gpu_1x_h100_sxm5"``."""
        return f"{self.provider}:{self.instance}"

    @property
    def billing(self) -> str:
        """The billing rule in words, e.g. ``"per minute, from health check"``."""
        names = {v: k for k, v in BILLING_MODES.items()}
        mode = names.get((self.increment_s, self.minimum_s))
        words = {
            "per_minute": "per minute",
            "per_second": "per second, min 60 s",
            "weekly": "weekly",
        }.get(mode or "", f"per {self.increment_s:g} s, min {self.minimum_s:g} s")
        start = "health check" if self.start_rule == "health_check" else "launch"
        return f"{words}, from {start}"


class Catalog:
    """Prices by (provider, instance); ``lookup`` explains a miss."""

    def __init__(self, entries: list[Price]) -> None:
        self.entries = list(entries)
        self._by_key = {(p.provider, p.instance): p for p in self.entries}

    def providers(self) -> list[str]:
        """Provider names, sorted."""
        return sorted({p.provider for p in self.entries})

    def lookup(self, provider: str, instance: str) -> Price:
        """The entry for ``provider``/``instance``; a UserError names the near matches."""
        found = self._by_key.get((provider, instance))
        if found is not None:
            return found
        providers = self.providers()
        if provider not in providers:
            raise UserError(
                f"cost.provider: unknown provider {provider!r}{_near(provider, providers)}; "
                "`acceptrun cost prices` lists the catalog"
            )
        instances = sorted(p.instance for p in self.entries if p.provider == provider)
        raise UserError(
            f"cost.instance: unknown {provider} instance {instance!r}"
            f"{_near(instance, instances)}; `acceptrun cost prices` lists the catalog, and a "
            f"workspace {PRICES_FILE} can add one"
        )


def _near(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    if close:
        return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"
    return f" (known: {', '.join(known)})"


# ---- loading ---------------------------------------------------------------------------------


def load_catalog(workspace_root: Path | None = None) -> Catalog:
    """The packaged catalog, then ``<workspace_root>/prices.toml`` over it when present."""
    packaged = files("acceptrun.cost").joinpath(PRICES_FILE)
    by_key: dict[tuple[str, str], Price] = {}
    sources: list[tuple[str, str]] = [
        (f"acceptrun/cost/{PRICES_FILE}", packaged.read_text("utf-8"))
    ]
    if workspace_root is not None:
        override = Path(workspace_root) / PRICES_FILE
        if os.path.lexists(override):
            sources.append((str(override), _read_override(Path(workspace_root), override)))
    for name, text in sources:
        for price in _parse(text, name):
            by_key[(price.provider, price.instance)] = price
    return Catalog(list(by_key.values()))


def _read_override(root: Path, path: Path) -> str:
    """The workspace's prices.toml as text: a regular file of the workspace only (a link,
    a FIFO, a device is refused unread, see acceptrun._util.confined), within the size
    limit of a TOML file, UTF-8."""
    try:
        return read_bytes_bounded(path, MAX_TOML_BYTES, root=root).decode("utf-8")
    except UnsafeFileError as exc:
        raise UserError(
            f"{path}: is {exc.what}, not a regular file, so it is not read; replace it with "
            f"a prices file (fields as in the packaged acceptrun/cost/{PRICES_FILE}) or remove it"
        ) from None
    except ValueError as exc:  # too large, or not UTF-8
        raise UserError(f"{path}: cannot be read as TOML ({exc}); fix or remove it") from None
    except OSError as exc:
        raise UserError(
            f"{path}: cannot be read ({exc.strerror or exc}); fix or remove it"
        ) from None


def _parse(text: str, source: str) -> list[Price]:
    """Every entry of one prices.toml; a UserError lists every problem, each with its entry."""
    try:
        raw = loads_toml(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{source}: not valid TOML ({toml_error(exc)})") from None
    unknown = [k for k in raw if k != "price"]
    entries = raw.get("price", [])
    if unknown or not isinstance(entries, list):
        raise UserError(
            f"{source}: expected only [[price]] tables, found {', '.join(unknown) or 'price'}; "
            f"one [[price]] table per instance, fields as in the packaged acceptrun/cost/{PRICES_FILE}"
        )
    problems: list[str] = []
    prices: list[Price] = []
    for i, item in enumerate(entries):
        where = f"price[{i}]"
        if isinstance(item, dict) and all(
            isinstance(item.get(k), str) for k in ("provider", "instance")
        ):
            where = f"{where} ({item['provider']}:{item['instance']})"
        entry: PriceEntry | None = build(PriceEntry, item, f"{where}.", problems)
        if entry is not None:
            prices.append(entry.price())
    if len(problems) == 1:
        raise UserError(f"{source}: {problems[0]}")
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise UserError(f"{source}: {len(problems)} problems\n{lines}")
    return prices


# ---- specs and budgets -----------------------------------------------------------------------


def price_for(spec_cost: CostSpec, catalog: Catalog) -> Price | None:
    """The price a spec's ``[cost]`` section means; None when it names none.

    provider + instance -> the catalog entry (``price_per_hour`` in the spec overrides its
    price, the billing rules stay); ``price_per_hour`` alone -> a per-minute price billed
    from launch, the conservative reading for an unknown provider, unless
    ``billing_increment`` names another increment (no minimum then).
    """
    provider, instance, per_hour = spec_cost.provider, spec_cost.instance, spec_cost.price_per_hour
    if provider is not None and instance is not None:
        price = catalog.lookup(provider, instance)
        if per_hour is not None:
            price = replace(price, price_per_hour=per_hour, source="spec", date="")
        return price
    if per_hour is not None:
        increment_s, minimum_s = BILLING_MODES["per_minute"]
        if spec_cost.billing_increment is not None:
            increment_s, minimum_s = float(spec_cost.billing_increment), 0.0
        return Price(
            provider=provider or "custom",
            instance=instance or "custom",
            gpus=0,
            gpu=None,
            price_per_hour=per_hour,
            increment_s=increment_s,
            minimum_s=minimum_s,
            start_rule="launch",
            storage_per_gib_month=0.0,
            source="spec",
            date="",
        )
    if provider is not None or instance is not None:
        given, missing = (
            ("provider", "instance") if provider is not None else ("instance", "provider")
        )
        raise UserError(
            f"cost.{missing}: missing; cost.{given} is set, so set cost.{missing} too "
            '(e.g. provider = "lambda", instance = "gpu_1x_a10") or set cost.price_per_hour'
        )
    return None


def check_budget(price: Price | None, budget_usd: float | None) -> None:
    """Refuse a budget that cannot pay for anything, before the machine is started."""
    if budget_usd is None:
        return
    if price is None:
        raise UserError(
            f"limits.budget_usd = {budget_usd:g} USD is set but the run has no price; "
            "set cost.price_per_hour or cost.provider/instance (see `acceptrun cost prices`)"
        )
    first_s = max(price.increment_s, price.minimum_s)  # seconds billed as soon as it starts
    first_usd = price.price_per_hour * first_s / 3600.0
    if budget_usd < first_usd:
        raise UserError(
            f"limits.budget_usd = {budget_usd:g} USD is below one billing increment of "
            f"{price.label} ({first_s:g} s at {price.price_per_hour:g} USD/h = "
            f"{first_usd:.4g} USD); raise it to at least {first_usd:.4g} USD"
        )


def format_prices(catalog: Catalog) -> str:
    """An aligned table of the catalog for ``acceptrun cost prices``."""
    header = (
        "provider",
        "instance",
        "GPUs",
        "USD/h",
        "billing",
        "storage USD/GiB-month",
        "source date",
    )
    rows = [header]
    for p in sorted(catalog.entries, key=lambda p: (p.provider, p.instance)):
        gpus = f"{p.gpus}x {p.gpu}" if p.gpu else (str(p.gpus) if p.gpus else "-")
        storage = f"{p.storage_per_gib_month:.2f}" if p.storage_per_gib_month else "-"
        rows.append(
            (p.provider, p.instance, gpus, f"{p.price_per_hour:.2f}", p.billing, storage, p.date)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    right = {3, 5}  # numbers align right
    lines = [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]
    return "\n".join(lines)
