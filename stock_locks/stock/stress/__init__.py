"""The oversell stress test: many processes buy the same stock at once, then we count.

What it sells
    By default a run creates its own stock rows, one set per strategy, named
    ``<prefix>-<run>-<strategy>-<n>`` (``<run>`` a random token, so they are
    never rows of yours), each with ``stock`` units. They are created through
    the project's stock model, so each field the model requires without a
    default, other than the SKU, quantity and ``fence`` fields, needs a value:
    a text one (``CharField`` or ``TextField`` without choices, such as a
    product's name) gets the row's SKU; any other needs ``fields`` (``--field
    NAME=VALUE``; ``{sku}`` in a value becomes the row's SKU, which a unique
    field needs), which may also give a text field another value. Or it sells
    SKUs that already exist (``existing``, ``--sku``), with the stock they
    have, and gives it back
    afterwards: run that where nothing else sells them meanwhile (a staging
    copy), since their units are sold out to the buyers during the run.
    :func:`check` finds what is missing before anything is written and
    raises :class:`StressRefused` saying what to give.

How it buys
    ``processes`` forked workers share ``buyers`` attempts, each a random
    cart of ``cart_size`` SKUs of ``qty`` units, through the ORM
    (``strategy.reserve``) or over HTTP against a running shop that uses the
    same database and Redis (``POST`` the order API: 201/200 sold, 409
    refused). What was sold is read back from the database, not trusted from
    the workers: oversold (must be 0), final stock (must equal initial minus
    sold, never below 0), and Redis-vs-database drift.

What it leaves
    Nothing of its own. Once the figures are measured, whatever happened
    (success, an oversell, errors, an interrupt), :class:`StressRun` removes
    what the run made: every reservation of its order refs in any state
    (for existing SKUs released first, or given back when committed, by
    relative writes, so their stock and counters end as they were even if
    something else changed them meanwhile), the Redis records, index entries
    and delay-queue expiry items of those refs, and the stock rows it created
    with their counters. Receivers of :data:`stress_cleanup` remove their own
    records of the run's orders first (a shop sold to over HTTP keeps orders
    that refer to the rows). What the library keeps stays: lock keys (their
    fence counters expire ``FENCE_RETENTION`` after the last grant, a minute
    unless the Redis clock runs behind the fence), the ``loaded`` marker, counters
    of existing SKUs (equal to the database), and the raised ``fence`` of an
    existing row the ``lock`` strategy wrote (fences only rise).
"""

from .plan import StressConfig, StressError, StressResult, check, new_token, stress_cleanup
from .report import stderr_if_tty, table_header, table_row, table_widths
from .run import StressRun, run_stress

__all__ = [
    "StressConfig",
    "StressError",
    "StressResult",
    "StressRun",
    "check",
    "new_token",
    "run_stress",
    "stderr_if_tty",
    "stress_cleanup",
    "table_header",
    "table_row",
    "table_widths",
]
