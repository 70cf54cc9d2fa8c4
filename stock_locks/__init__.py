"""stock_locks: Redis locks and stock reservations that stop a Django shop from overselling.

Public API::

    from stock_locks import Lock, locked, lock_model

Importing this package loads no models and touches no settings; names are
imported on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .decorators import lock_model, locked
    from .locks import Lock

__all__ = ["Lock", "locked", "lock_model"]

_WHERE = {
    "Lock": ".locks",
    "locked": ".decorators",
    "lock_model": ".decorators",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'stock_locks' has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value
