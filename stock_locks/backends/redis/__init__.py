"""One Redis server (on its own or under Sentinel), or one Redis Cluster: locks and
semaphores as Lua scripts.

- :mod:`.protocol`: the scripts' KEYS and ARGV built, replies parsed, reply codes;
- :mod:`.requests`: what a transport performs, and the policies every transport
  runs (NOSCRIPT, redirects, bounded requests);
- :mod:`.backend`: :class:`RedisBackend`, each operation a generator of requests;
- :mod:`.transport` (redis-py) and :mod:`.aio_transport` (``redis.asyncio``);
- :mod:`.client`: the clients, built from one set of options; :func:`get_redis`;
- :mod:`.sentinel`: where a Sentinel-managed primary is found;
- :mod:`.errors`: what redis-py raises, sorted by what it means;
- :mod:`.cluster`, :mod:`.wakeup`, :mod:`.listener`, :mod:`.held`: reaching one
  node of a cluster, blocking pops, the asyncio wake-up listener, the
  held-locks index.
"""

from .backend import RedisBackend, backend_for_client, shared_backend
from .client import get_redis

__all__ = ["RedisBackend", "backend_for_client", "get_redis", "shared_backend"]
