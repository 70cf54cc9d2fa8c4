"""Signals a project connects to for its own bookkeeping and alerting.

``reservation_expired``: an unpaid reservation was released because it was
due. Sent with ``sender=Reservation`` and keyword arguments ``order_ref``
(str) and ``lines`` (dict SKU -> quantity), after the release committed, by
the one caller that released it. A process that dies between the two sends
nothing: an order whose reservation is released must also be recognised when
it is paid (commit raises ReservationError). Receivers should be idempotent,
e.g. a conditional UPDATE of the order's status.

``lock_lost``: a holder found its lease gone (it ran out, or another holder
took the name): a release, extend or watchdog renewal that was refused, or a
re-entry of a lost reentrant lock. Keyword arguments ``primitive`` ("lock",
"semaphore", "fair semaphore"), ``backend`` (alias) and ``name``. Sent in the
holder's thread (or event loop), before the error reaches it.

``stock_refused``: a reserve was refused for lack of stock. Keyword
arguments ``strategy``, ``order_ref``, ``sku``, ``requested``, ``available``.
Sent only when someone listens (a flash sale refuses thousands a second):
keep receivers cheap, e.g. a counter or a rate-limited alert.

Both are sent with ``sender=None``; receivers must not raise.
"""

from __future__ import annotations

from django.dispatch import Signal

reservation_expired = Signal()
lock_lost = Signal()
stock_refused = Signal()
