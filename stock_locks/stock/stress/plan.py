"""A stress run's plan and outcome: its options, checked before anything is written,
the rows it sells, and its figures."""

from __future__ import annotations

import re
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import models
from django.db.models.fields import NOT_PROVIDED, AutoFieldMixin
from django.dispatch import Signal
from redis.exceptions import RedisError

from ...backends.redis.client import get_redis
from ...exceptions import StockLocksError
from ..registry import get_strategy
from ..table import StockTable

PROGRESS_EVERY = 25  # attempts between a worker's progress updates
STOP_GRACE = 10  # seconds a stopped worker gets to finish its attempt, then it is terminated
TOKEN_BYTES = 3  # a run's token: 6 hex digits in its SKUs and order refs
PREFIX = re.compile(r"[A-Za-z0-9_.:-]{1,20}")  # order refs travel as Idempotency-Key headers
BATCH = 500  # Redis commands per pipeline

#: Sent once per strategy run after its figures were measured, before its data is
#: removed, with ``sender=StressRun`` and keyword arguments ``strategy`` (str),
#: ``order_refs`` (list of str: every reservation of the run, in any state),
#: ``skus`` (list of str: the SKUs it sold) and ``created`` (bool: whether those
#: rows are the run's own, deleted next). Connect a receiver that deletes your
#: own records of these orders, e.g. a shop's orders placed over HTTP, which
#: may also protect the rows from deletion. Receivers run even after an
#: interrupt; a receiver's error is reported as data left behind.
stress_cleanup = Signal()


class StressError(StockLocksError):
    """What a stress run cannot do; the message says what to change."""


class StressRefused(StressError):
    """Refused before the run wrote anything (a missing value, a bad option)."""


class StressAborted(StressError):
    """The run stopped early; its data was removed all the same."""


class _StrategyNotAccepted(Exception):
    """The shop refuses a strategy in the order body (a worker stops the run)."""


@dataclass
class StressConfig:
    stock: int = 100  # units per created SKU (existing SKUs keep their own)
    buyers: int = 1000
    processes: int = 8
    qty: int = 1
    cart_size: int = 1
    skus: int = 0  # SKUs created per strategy; 0: cart_size (one hot SKU for single-item carts)
    via: str = "orm"
    url: str = "http://127.0.0.1:8000/api/orders/"
    prefix: str = "STRESS"
    seed: int = 0
    existing: tuple[str, ...] = ()  # sell these SKUs (with their stock) instead of creating rows
    fields: dict[str, str] = field(default_factory=dict)  # created rows' other required fields

    @property
    def pool(self) -> int:
        return len(self.existing) if self.existing else max(self.skus, self.cart_size)


@dataclass
class StressResult:
    strategy: str
    attempts: int
    sold: int  # units, read back from the database
    refused: int
    errors: int
    oversold: int
    final_stock: int
    drift: int
    throughput_per_s: float
    p50_ms: float
    p99_ms: float
    retries: int
    orders: int = 0  # attempts that reserved
    initial_stock: int = 0
    conserved: bool = True
    seconds: float = 0.0
    error_samples: list[str] = field(default_factory=list)
    skus: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing oversold, lost or drifted, and every attempt answered (sold or refused)."""
        return (
            self.oversold == 0
            and self.drift == 0
            and self.conserved
            and self.final_stock >= 0
            and self.errors == 0
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CleanupReport:
    """What :meth:`StressRun.clean_up` removed, and what it could not."""

    reservations: int = 0  # reservation rows deleted
    given_back: int = 0  # of which released or given back first (existing SKUs)
    rows: int = 0  # stock rows deleted
    redis: int = 0  # Redis keys and entries removed (records, index entries, counters)
    expiries: int = 0  # delay-queue expiry items removed
    stock: dict[str, tuple[int, int | None]] = field(default_factory=dict)  # existing: before, now
    problems: list[str] = field(default_factory=list)  # what was left behind, and why
    notes: list[str] = field(default_factory=list)  # worth saying, nothing left behind

    def summary(self) -> str:
        parts = [
            f"{self.reservations} reservation(s)"
            + (f" ({self.given_back} given back first)" if self.given_back else ""),
            *([] if self.stock else [f"{self.rows} stock row(s)"]),  # existing SKUs: none made
            f"{self.redis} Redis key(s) and entries",
        ]
        if self.expiries:
            parts.append(f"{self.expiries} expiry item(s)")
        text = "removed " + ", ".join(parts)
        for sku, (before, now) in self.stock.items():
            text += f"; {sku}: {before} before, {now} now"
            if now != before:
                text += " (changed by something else during the run)"
        return "; ".join([text, *self.notes])


def new_token() -> str:
    """A run's random token, in its SKUs and order refs."""
    return secrets.token_hex(TOKEN_BYTES)


# -- what a run needs ---------------------------------------------------------------


def check(config: StressConfig, strategies: list[str], token: str) -> None:
    """Check, without writing anything, everything runs of ``strategies`` need.

    Raises :class:`StressRefused` with what is missing and how to give it:
    bad options, an unknown or unusable strategy, Redis unreachable, required
    fields of the stock model without a value, values the model rejects,
    existing SKUs that do not exist.
    """
    problems = option_problems(config)
    if problems:
        raise StressRefused("; ".join(problems))
    try:
        stock = StockTable()
    except ImproperlyConfigured as exc:
        raise StressRefused(str(exc)) from None
    chosen = []
    for name in strategies:
        try:
            chosen.append(get_strategy(name))
        except (ValueError, ImproperlyConfigured) as exc:
            raise StressRefused(f"strategy {name!r} cannot run here: {exc}") from None
    if config.via == "http" or any(s.uses_redis for s in chosen):
        try:
            get_redis().ping()
        except (RedisError, OSError) as exc:
            raise StressRefused(f"Redis is unreachable: {exc}") from None
    if config.existing:
        levels = stock.levels(list(config.existing))
        unknown = [sku for sku in config.existing if sku not in levels]
        if unknown:
            raise StressRefused(
                f"no {stock.model._meta.label} with {stock.sku} {', '.join(map(repr, unknown))}"
            )
        return
    for name in strategies:
        new_rows(stock, config, name, token)


def option_problems(config: StressConfig) -> list[str]:
    """What is wrong with the options, as the command's flags name them."""
    problems = []
    for name in ("stock", "buyers", "processes", "qty", "cart_size"):
        if getattr(config, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be at least 1")
    if config.skus and config.skus < config.cart_size:
        problems.append("--skus must be at least --cart-size")
    if config.via == "http":
        parts = urlsplit(config.url)
        if parts.scheme != "http" or not parts.hostname:
            problems.append(f"--url {config.url!r} must be an http:// URL of the order API")
    if not PREFIX.fullmatch(config.prefix):
        problems.append("--prefix must be 1-20 of A-Z a-z 0-9 _ . : -")
    if config.existing:
        if len(set(config.existing)) != len(config.existing):
            problems.append("--sku names a SKU twice")
        if len(config.existing) < config.cart_size:
            problems.append("--cart-size cannot exceed the number of --sku given")
        if config.skus:
            problems.append("--skus sets how many rows to create; with --sku none are")
        if config.fields:
            problems.append("--field sets fields of rows the run creates; with --sku none are")
    return problems


def needed_fields(stock: StockTable) -> list[models.Field]:
    """Fields of the stock model a new row needs a value for: no default (Python or
    database), not null, not automatic, not a blank-able text, and not the SKU,
    quantity or fence field."""
    own = {stock.sku, stock.qty, "fence"}
    needed = []
    for f in stock.model._meta.concrete_fields:
        if (
            f.name in own
            or f.auto_created
            or isinstance(f, AutoFieldMixin)
            or getattr(f, "generated", False)
            or getattr(f, "auto_now", False)
            or getattr(f, "auto_now_add", False)
            or f.has_default()
            or getattr(f, "db_default", NOT_PROVIDED) is not NOT_PROVIDED
            or f.null
            or (f.blank and f.empty_strings_allowed)
        ):
            continue
        needed.append(f)
    return needed


def filled_with_the_sku(f: models.Field) -> bool:
    """A needed field the run fills with the row's SKU unless ``--field`` gives it: free
    text (a CharField or TextField without choices), such as a product's name."""
    return isinstance(f, models.CharField | models.TextField) and not f.choices


def required_fields(stock: StockTable) -> list[models.Field]:
    """Needed fields the run cannot make up (not free text): they need ``--field``."""
    return [f for f in needed_fields(stock) if not filled_with_the_sku(f)]


def new_rows(stock: StockTable, config: StressConfig, strategy: str, token: str) -> list:
    """The unsaved, validated rows a run of ``strategy`` creates. Read-only.

    Raises :class:`StressRefused` naming the fields that need ``--field`` values,
    unknown or reserved ``--field`` names, and values the model rejects.
    """
    model = stock.model
    label = model._meta.label
    by_name = {f.name: f for f in model._meta.concrete_fields}
    by_name.update({f.attname: f for f in model._meta.concrete_fields})
    unknown = [name for name in config.fields if name not in by_name]
    if unknown:
        raise StressRefused(
            f"{label} has no field {', '.join(map(repr, unknown))} (--field); its fields: "
            f"{', '.join(f.name for f in model._meta.concrete_fields)}"
        )
    own = [name for name in config.fields if by_name[name].name in (stock.sku, stock.qty, "fence")]
    if own:
        raise StressRefused(f"--field {', '.join(own)}: the run sets that field itself")
    given = {by_name[name].name for name in config.fields}
    missing = [f for f in required_fields(stock) if f.name not in given]
    texts = [f for f in needed_fields(stock) if filled_with_the_sku(f) and f.name not in given]
    if missing:
        names = ", ".join(f"{f.name} ({type(f).__name__})" for f in missing)
        example = " ".join(f"--field {f.name}=..." for f in missing)
        raise StressRefused(
            f"the stress run creates its own {label} rows, and {label} requires fields it "
            f"cannot fill in: {names} (a required text field gets the row's SKU). Give "
            f"values for them ({example}; '{{sku}}' in a value "
            "becomes the row's SKU, which a unique field needs), or stress SKUs that already "
            "exist with --sku CODE (their stock is sold, then given back)"
        )
    skus = [f"{config.prefix}-{token}-{strategy}-{n}" for n in range(config.pool)]
    rows = []
    for sku in skus:
        values: dict[str, Any] = {stock.sku: sku, stock.qty: config.stock}
        if "fence" in by_name:
            values["fence"] = 0
        for f in texts:
            values[f.attname] = sku
        for name, text in config.fields.items():
            f = by_name[name]
            values[f.attname] = text.replace("{sku}", sku)
        row = model(**values)
        try:
            row.full_clean()  # reads only: field values, validators, uniqueness, constraints
        except ValidationError as exc:
            details = "; ".join(
                f"{name}: {' '.join(messages)}" for name, messages in exc.message_dict.items()
            )
            filled = "".join(
                f" ({f.name}: the row's SKU, by default)"
                for f in texts
                if f.name in exc.message_dict
            )
            raise StressRefused(
                f"the stress row {sku!r} would not be a valid {label}: {details}{filled} "
                "(give or fix values with --field)"
            ) from None
        rows.append(row)
    for name, text in config.fields.items():
        f = by_name[name]
        if f.unique and len(rows) > 1 and "{sku}" not in text:
            raise StressRefused(
                f"{label}.{f.name} is unique and the run creates {len(rows)} rows: put "
                f"'{{sku}}' in its value (--field {name}=...{{sku}})"
            )
    return rows


# -- a run ----------------------------------------------------------------------------
