"""Signals a project connects to for its own bookkeeping and alerting.

``reservation_expired``: an unpaid reservation was released because it was
due. Sent with ``sender=Reservation`` and keyword arguments ``order_ref``
(str) and ``lines`` (dict SKU -> quantity), after the release committed, by
the one caller that released it. A process that dies between the two sends
nothing: an order whose reservation is released must also be recognised when
it is paid (commit raises ReservationError). Receivers should be idempotent,
e.g. a conditional UPDATE of the order's status.
"""

from __future__ import annotations

from django.dispatch import Signal

reservation_expired = Signal()
