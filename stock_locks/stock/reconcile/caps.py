"""Purchase-cap usage in Redis against the database: measured and repaired.

``lua`` and ``watch`` keep each customer's units under a cap in Redis (a hash order
ref -> ``units:ms``, :mod:`stock_locks.stock.caps`), the database's reservations
are the record. Per (cap, customer) with reservations holding stock in the cap's
window, the measure compares the two:

- an entry whose order has a Redis reservation record is work in flight (its
  database step pending, or its release not done in Redis yet): not drift;
- an entry with neither a reservation holding stock nor a record counts units
  the customer does not hold (Redis refuses them too early): drift, removed;
- a reservation holding stock without an entry (Redis lost it) lets Redis say
  yes where the database will say no (safe, but a round trip to the database):
  drift, added back.

Customers with entries but no reservation in the window are not visited (it would
take a scan of the keyspace); the sweeper's orphan give-back removes such
entries with their record. ``manage.py reconcile_stock`` reports and repairs it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from django.utils import timezone

from ...backends.redis.client import get_redis
from ...backends.redis.protocol import decoded
from ...keys import StockKeys
from ..caps import configured_caps, held_under_caps


@dataclass
class CapUsage:
    cap: str
    customer: str
    db: int  # units the customer holds under the cap in its window (the database)
    redis: int  # units Redis counts for them, in flight included
    in_flight: int  # of those, entries whose order still has a Redis record
    stale: list[str]  # order refs Redis counts that hold nothing
    missing: dict[str, str]  # order ref -> "units:ms" the database holds and Redis lacks

    @property
    def drift(self) -> int:
        return self.redis - self.in_flight - self.db

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "drift": self.drift}


def cap_usage_report(client: Any = None) -> list[CapUsage]:
    """Every (cap, customer) with reservations holding stock in the cap's window, by cap
    and customer (see the module's docstring)."""
    client = client or get_redis()
    keys = StockKeys()
    now_ms = int(timezone.now().timestamp() * 1000)
    by_cap: dict[str, dict[str, dict[str, str]]] = {}  # cap -> customer -> ref -> entry
    for row in held_under_caps():
        by_cap.setdefault(row.cap.name, {}).setdefault(row.customer, {})[row.ref] = row.entry
    report = []
    for cap in configured_caps().values():
        start = cap.window_start_ms(now_ms)
        held = by_cap.get(cap.name, {})
        customers = sorted(held)
        pipe = client.pipeline(transaction=False)
        for customer in customers:
            pipe.hgetall(keys.cap_usage(cap.name, customer))
        usages = [
            {decoded(ref): decoded(value) for ref, value in usage.items()}
            for usage in pipe.execute()
        ]
        unheld = sorted({ref for c, u in zip(customers, usages, strict=True) for ref in u
                         if ref not in held[c]})  # fmt: skip
        pipe = client.pipeline(transaction=False)
        for ref in unheld:
            pipe.exists(keys.record(ref))
        recorded = {ref for ref, n in zip(unheld, pipe.execute(), strict=True) if n}
        for customer, usage in zip(customers, usages, strict=True):
            counted = {
                ref: int(value.split(":")[0])
                for ref, value in usage.items()
                if int(value.split(":")[1]) >= start
            }
            report.append(
                CapUsage(
                    cap=cap.name,
                    customer=customer,
                    db=sum(int(value.split(":")[0]) for value in held[customer].values()),
                    redis=sum(counted.values()),
                    in_flight=sum(
                        n
                        for ref, n in counted.items()
                        if ref not in held[customer] and ref in recorded
                    ),  # fmt: skip
                    stale=sorted(
                        ref for ref in counted if ref not in held[customer] and ref not in recorded
                    ),  # fmt: skip
                    missing={
                        ref: value for ref, value in held[customer].items() if ref not in usage
                    },  # fmt: skip
                )
            )
    return report


def repair_cap_usage(client: Any = None) -> dict[str, int]:
    """Remove the stale entries and add the missing ones of every drifting (cap,
    customer); ``{"cap/customer": drift before}``. Safe during sales: an entry is
    removed only if its order holds nothing and has no record (a reserve writes
    both at once), and one added is a reservation the database held when measured
    (one released in between is left counted, and removed by the next run)."""
    client = client or get_redis()
    keys = StockKeys()
    fixed = {}
    for usage in cap_usage_report(client):
        if not usage.stale and not usage.missing:
            continue
        key = keys.cap_usage(usage.cap, usage.customer)
        pipe = client.pipeline(transaction=False)
        if usage.stale:
            pipe.hdel(key, *usage.stale)
        if usage.missing:
            pipe.hset(key, mapping=usage.missing)
        pipe.execute()
        fixed[f"{usage.cap}/{usage.customer}"] = usage.drift
    return fixed
