"""The ``lua`` strategy: one script checks every line and decrements all or none.

Refusals (the bulk of a flash sale) are answered by Redis alone, in one round
trip, without touching the database; under asyncio (:meth:`LuaStrategy.areserve`)
without leaving the event loop. A yes is confirmed in the database in
the same request (reservation row plus ``stock >= qty`` decrements, one
transaction); if the database refuses, the Redis half is given back before
the error surfaces.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from asgiref.sync import sync_to_async

from .. import scripts
from ..backends.redis.requests import Blocking, Command, Requests, script
from ..conf import settings
from ..exceptions import OutOfStock, RedisUnavailable, StockLocksError
from ..models import Reservation
from . import groupcommit
from .caps import NOBODY, Buyer, buyer_of, exceeded
from .cart import Cart
from .counters import RedisStockStrategy, unanswered_reserve
from .groupcommit import Confirmation
from .soldout import cache_for

# stock_reserve.lua's reply codes
SHORT, RESERVED, ALREADY_RESERVED, NOT_LOADED, DATA_LOST, CAPPED = 0, 1, 2, 3, 4, 5
MAX_LOADS = 3
LISTENER_WARM_UP = 2.0  # seconds warm_up waits for the sold-out listener


class LuaStrategy(RedisStockStrategy):
    def warm_up(self) -> None:
        """(Also starts this process's sold-out listener and waits, at most
        ``LISTENER_WARM_UP`` seconds, until it listens.)"""
        super().warm_up()
        if (sold_out := cache_for(self.redis, self.keys.versions)) is not None:
            sold_out.wait_listening(LISTENER_WARM_UP)

    def refuse_known_short(self, order_ref: str, lines: Cart, fresh_ref: bool) -> None:
        """(Most attempts of a sale end here.)"""
        if (short := self._known_short(lines)) is None:
            return
        if fresh_ref:
            raise OutOfStock(*short)
        try:
            self.backend.run(self._refused_unless_recorded(order_ref, short))
        except RedisUnavailable as exc:
            raise unanswered_reserve(exc, order_ref) from exc

    def _known_short(self, lines: Cart) -> tuple[str, int, int] | None:
        """The line this process knows asks more than is left, if any."""
        sold_out = cache_for(self.redis, self.keys.versions)
        return sold_out.short_line(lines) if sold_out is not None else None

    def _refused_unless_recorded(
        self, order_ref: str, short: tuple[str, int, int]
    ) -> Requests[None]:
        """OutOfStock for a line known short, unless Redis holds a record of
        ``order_ref``: an earlier attempt of it (a retry after a lost reply, a
        duplicate request in flight) took units, and the script answers with them.
        One ``EXISTS`` instead of the script: the answer Redis would give."""
        record = self.keys.record(order_ref)
        if not (yield Command(("EXISTS", record), record)):
            raise OutOfStock(*short)

    def reserve_in_redis(
        self, order_ref: str, lines: Cart, job: Confirmation | None = None, buyer: Buyer = NOBODY
    ) -> tuple[bool, int, int, Any]:
        """(The script joins the group commit for ``job`` in the same round trip. A
        refusal this process already knows is answered before, by ``do_reserve`` and
        ``areserve``; this asks Redis.)"""
        return self.backend.run(self._reserve_steps(order_ref, lines, job, buyer))

    def _reserve_steps(
        self, order_ref: str, lines: Cart, job: Confirmation | None = None, buyer: Buyer = NOBODY
    ) -> Requests[tuple[bool, int, int, Any]]:
        skus = list(lines)
        k = self.keys
        keys = [
            k.record(order_ref), k.index, k.loaded, k.versions, k.confirm_queue,
            k.confirm_leader, *map(k.counter, skus),
            *(k.cap_usage(cap.name, buyer.customer) for cap in buyer.caps),
        ]  # fmt: skip
        argv: list[Any] = [
            order_ref,
            len(buyer.caps),
            *lines.values(),
            *skus,
            *buyer.script_args(lines),
        ]
        sold_out = cache_for(self.redis, k.versions)
        for _ in range(MAX_LOADS):
            ticket = sold_out.ticket() if sold_out is not None else None
            join = job.join_args() if job is not None and groupcommit.applies() else []
            reply = yield from script(scripts.STOCK_RESERVE, keys, [*argv, *join])
            code = reply[0]
            if code in (RESERVED, ALREADY_RESERVED):
                joined = reply[2] if len(reply) > 2 else None
                return code == RESERVED, int(reply[1]), 0, joined
            if code == SHORT:
                sku, avail = skus[reply[1] - 1], int(reply[2])
                if sold_out is not None:
                    sold_out.refused(ticket, sku, avail, int(reply[3]))
                raise OutOfStock(sku, lines[sku], avail)
            if code == CAPPED:
                raise exceeded(buyer.caps[reply[1] - 1], lines, int(reply[2]))
            # (rare, and bound to the database: under asyncio these run in a thread)
            if code == DATA_LOST:
                yield Blocking(self.restore_after_data_loss)
            else:
                missing = [skus[i - 1] for i in reply[1:]]
                yield Blocking(functools.partial(self.load_counters, missing))
        raise StockLocksError(f"stock counters for {skus} keep disappearing (evicted?)")

    async def areserve(
        self,
        order_ref: str,
        cart: Mapping[str, int],
        *,
        ttl: float | None = None,
        customer: str | int | None = None,
        fresh_ref: bool = False,
    ) -> Reservation:
        """:meth:`reserve` for async views: the Redis half runs on the event loop (a
        refusal, most of a flash sale, never leaves it), the database half in
        Django's thread for sync code (``sync_to_async``: ``atomic`` is sync)."""
        ref, lines, ttl_ms = self.validate(order_ref, cart, ttl)
        if settings.STOCK_CAP_FIELD:  # (the stock model's caps may be read from the database)
            buyer = await sync_to_async(buyer_of)(customer, lines)
        else:
            buyer = buyer_of(customer, lines)
        with self.recording_outcome(ref):
            if (short := self._known_short(lines)) is not None and fresh_ref:
                raise OutOfStock(*short)
            try:
                if short is not None:
                    await self.backend.arun(self._refused_unless_recorded(ref, short))
                steps = self._reserve_steps(ref, lines, buyer=buyer)
                took, now_ms, retries, _ = await self.backend.arun(steps)
            except RedisUnavailable as exc:
                raise unanswered_reserve(exc, ref) from exc

        def in_database() -> Reservation:
            with self.recording_outcome(ref):
                reservation = self.reserve_in_database(
                    ref, lines, ttl_ms, took, now_ms, retries, buyer=buyer
                )
            return self.after_reserve(reservation, ttl_ms)

        return await sync_to_async(in_database)()
