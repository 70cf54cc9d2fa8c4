"""Admission passes: proof that a visitor was admitted, checked without Redis.

A pass is ``"<ticket>.<born>.<issued>"`` signed with :class:`django.core.signing.Signer`
(HMAC-SHA256 with ``SECRET_KEY``) under a salt naming the event and the visitor's
session binding (a random id kept in its session, :func:`~.gate.visitor_of`): a pass
copied to another session, or made for another event, fails the signature like a
forged one. ``issued`` (Unix seconds) is inside the signed
value, so its age cannot be changed. A request presenting a pass younger than
the room's pass refresh goes through at the cost of one HMAC; an older one (up to
``session_ttl``) is renewed in Redis (:meth:`~.queue.WaitingRoom.touch`), which
also says whether its slot was freed meanwhile.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from django.core import signing

from ..exceptions import ExpiredPass, InvalidPass

SALT = "stock_locks.waitingroom"
CLOCK_SKEW = 5  # seconds a pass may seem issued in the future (web servers' clocks differ)


class AdmissionPass(NamedTuple):
    """A checked pass: the ticket it admits, the room state it was issued under
    (``born``, ms) and when it was issued (Unix seconds)."""

    ticket: int
    born: int
    issued: int

    def age(self, now: float | None = None) -> float:
        """Seconds since it was issued."""
        return (time.time() if now is None else now) - self.issued


def _signer(event: str, binding: str) -> signing.Signer:
    return signing.Signer(salt=f"{SALT}:{event}:{binding}")


def issue_pass(event: str, binding: str, ticket: int, born: int) -> str:
    """A pass admitting ``ticket`` of ``event`` to the session whose binding is ``binding``."""
    return _signer(event, binding).sign(f"{ticket}.{born}.{int(time.time())}")


def check_pass(token: str, event: str, binding: str, max_age: float) -> AdmissionPass:
    """The pass ``token`` read for ``event`` and the session ``binding``: no round trip.

    Raises :class:`~stock_locks.exceptions.InvalidPass` (reason "forged": a bad
    signature, another event or another session; "malformed") or
    :class:`~stock_locks.exceptions.ExpiredPass` (older than ``max_age`` seconds,
    or issued in the future).
    """
    try:
        value = _signer(event, binding).unsign(token)
    except signing.BadSignature:
        raise InvalidPass(f"admission pass refused for event {event!r}", event=event) from None
    try:
        ticket, born, issued = (int(part) for part in value.split("."))
    except ValueError:
        raise InvalidPass(
            f"admission pass unreadable for event {event!r}", event=event, reason="malformed"
        ) from None
    admission = AdmissionPass(ticket, born, issued)
    if not -CLOCK_SKEW <= admission.age() <= max_age:
        raise ExpiredPass(
            f"admission pass of event {event!r} expired", event=event, reason="expired"
        )
    return admission
