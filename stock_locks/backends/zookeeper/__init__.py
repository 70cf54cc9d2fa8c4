"""ZooKeeper: a lock held by a session and fenced by the consensus log.

Configured as a ``BACKENDS`` alias (needs the ``[zookeeper]`` extra, kazoo)::

    "zk": {
        "BACKEND": "stock_locks.backends.zookeeper.ZooKeeperBackend",
        "LOCATION": "zk1:2181,zk2:2181,zk3:2181",   # or a list of host:port
        "OPTIONS": {"ROOT": "/stock_locks", "SESSION_TIMEOUT": 10, "CONNECT_TIMEOUT": 5},
    }



The queue. Lock ``name`` is the znode ``<ROOT>/locks/<name, percent-encoded>``;
each contender is an ephemeral sequential child ``<token>-<sequence>`` holding
the holder's record (JSON: token, count, host, pid, thread, caller, watchdog).
The child with the lowest sequence number holds the lock. A try creates its
child and lists the queue in one round trip (ZooKeeper answers a session's
requests in order); when its child is not first it deletes it again and is
refused, so a caller that gives up leaves nothing behind. A waiter then queues a
child of its own and sets a watch on the child just before it, only that one:
a release wakes one waiter, and a waiter whose predecessor left without holding
(it gave up) watches the next one instead, without waking anybody. Nobody polls.

The fence is the holder's child's creation zxid (``czxid``): the position of
its creation in the ensemble's log. Every later grant of the name is a child
created later, so its zxid is greater, across leader elections too (a new
leader starts a new epoch, the high 32 bits of every zxid it assigns).

Sessions, not leases. A grant lasts as long as the client's session: its child
is ephemeral and the ensemble deletes it when the session expires (the process
died, or was paused or cut off for longer than ``SESSION_TIMEOUT``). Then
``lost`` is set on the Lock (from the session listener once this client learns
the session expired, or from the watchdog's check), ``release()`` raises
:class:`~stock_locks.exceptions.LockNotOwned`, and a paused holder's fenced
writes are refused because the next holder's fence is greater. What the Lock
arguments mean here:

- ``ttl``: no lease. It bounds how long a waiter sleeps before it looks at
  the queue again when no wake-up came (a safety net: the watch wakes it).
  ``extend()`` only checks that the token still holds the lock.
- ``watchdog``: a check every ``ttl / 3`` that the holder's child still
  exists; it sets ``lost`` as soon as it does not. ``max_hold``: the watchdog
  deletes the child once the lock was held that long (this process's clock),
  so a hung but alive worker loses it.
- The backend declares ``SESSION_BOUND`` and not ``LEASED`` or
  ``SERVER_CLOCK``; ``LockInfo.remaining`` and ``ttl`` are None, and
  ``acquired_at`` is the child's creation time on the leader's clock.

Every call is safe to repeat. A try finds the children of its token (a create
whose reply was lost) and keeps only the oldest; a release after a lost reply
is recognised (this process remembers the tokens it released or tried to), and
an acquire's give-back deletes every child of its token and makes this
process refuse later tries with it. One kazoo client per backend and process,
made on first use (a forked child makes its own).

The operations are :mod:`.backend`; the queue's names and order :mod:`.queue`;
reading holders :mod:`.holders`; the kazoo client and its session :mod:`.session`.
"""

from .backend import ZooKeeperBackend
from .queue import ZooKeeperKeys, queue_order

__all__ = ["ZooKeeperBackend", "ZooKeeperKeys", "queue_order"]
