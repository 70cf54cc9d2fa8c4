"""Dashboard: the cost of one refresh of the admin page against the size of the keyspace,
and the Redis memory the fence counters of paid orders hold.

a. Refresh cost. The page polls its JSON every 3 s; its Redis reads are the
   charts (the metrics timeline), the held locks (their index), the semaphores
   and the delay queues (``stock_locks.dashboard``: ``charts()``,
   ``lock_page()``, ``semaphores()``, ``delay_queues()``; the stock table reads
   the database, and ZooKeeper tables ZooKeeper). Redis holds a few semaphores
   with holders, a delay queue with items and a dead letter, and held locks,
   among 0, 100k and 400k unrelated keys: the fence counters that paid orders
   leave (``sl:lock:{order:N}:fence``, with the old retention of a day), written
   by pipelined SETs. Contenders, interleaved, medians of several refreshes:
   the refresh as shipped (semaphores and queues found in their registries),
   and the same refresh as it was before the registries (found by SCAN MATCH of
   the keyspace, COUNT 1000, then one read per semaphore), both listing the
   same rows (checked).
b. Fence counters. N order locks each granted and released once (pipelined
   ``lock_acquire.lua`` + ``lock_release.lua``, the scripts ``Lock`` runs, lease
   30 s), INFO ``used_memory`` before and after, and the fence counters' TTL with
   ``FENCE_RETENTION`` at the old default (a day after the last grant) and the
   new one (a minute after the Redis clock passed the fence, at least the
   lease): what a million orders a day keep in Redis either way. Then (not with
   ``--quick``) the memory once the counters have expired.

Runs against a private redis-server; Django is set up with the demo settings.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from . import support

SIZES = (0, 100_000, 400_000)  # unrelated keys
QUICK_SIZES = (0, 100_000)
FILL_CHUNK = 10_000  # keys per pipeline when filling
REPEATS = 15  # refreshes per contender and size (medians)
SEMAPHORES = 5  # with one holder each
HELD_LOCKS = 20
QUEUE = "bench_orders"
QUEUED = 50  # items due in an hour, plus one dead letter
ORDERS = 200_000  # part b: order locks granted and released
QUICK_ORDERS = 20_000
DAY = 86_400  # seconds
OLD_RETENTION = DAY  # FENCE_RETENTION's default before: a day after the last grant
TARGET_RATIO = 1.5  # refresh at the largest keyspace / refresh at 0 keys, at most


def parse_args(argv: list[str]) -> Any:
    parser = support.parser("dashboard", __doc__, sections="ab")
    parser.add_argument("--repeats", type=int, default=REPEATS, help=f"a: ({REPEATS})")
    parser.add_argument("--orders", type=int, default=ORDERS, help=f"b: ({ORDERS})")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.orders = 5, QUICK_ORDERS
    return args


# -- a. refresh cost -----------------------------------------------------------------


def _seed_shown(client: Any) -> list[Any]:
    """What the page shows: semaphores with a holder, a queue with items and a dead
    letter, held locks. Returns the holders (kept until the end)."""
    from stock_locks import DelayQueue, Lock, Semaphore

    held: list[Any] = []
    for n in range(SEMAPHORES):
        permit = Semaphore(f"bench:export:{n}", 3, ttl=3600, redis=client)
        permit.acquire()
        held.append(permit)
    queue = DelayQueue(QUEUE, max_attempts=1, redis=client)
    for n in range(QUEUED):
        queue.schedule("bench.later", {"order": n}, delay=3600, id=f"later-{n}")
    queue.schedule("bench.missing", id="dead")
    [item] = queue.claim()
    queue.fail(item.id, "no handler")  # its only delivery: a dead letter
    for n in range(HELD_LOCKS):
        lock = Lock(f"bench:held:{n}", ttl=3600, redis=client)
        lock.acquire()
        held.append(lock)
    return held


def _fill(client: Any, start: int, stop: int) -> None:
    """Fence counters of orders ``start``..``stop`` as the old retention left them."""
    from stock_locks.keys import lock_keys

    seconds, micros = client.time()
    fence = int(seconds) * 1_000_000 + int(micros)
    for chunk in range(start, stop, FILL_CHUNK):
        pipe = client.pipeline(transaction=False)
        for n in range(chunk, min(chunk + FILL_CHUNK, stop)):
            pipe.set(lock_keys(f"order:{n}").fence, fence + n, px=OLD_RETENTION * 1000)
        pipe.execute()


def _refresh(client: Any) -> tuple[list[str], list[str]]:
    """One refresh's Redis reads as shipped; the semaphores' and queues' names."""
    from stock_locks.backends.redis.errors import translated
    from stock_locks.dashboard.snapshot import charts, delay_queues, lock_page, semaphores
    from stock_locks.dashboard.timeline import recent

    with translated():
        charts(recent(300, client))  # the default window's timeline
        lock_page("", 1, client)
        rows = semaphores(client), delay_queues(client)
    return [row["name"] for row in rows[0]], [row["name"] for row in rows[1]]


def _refresh_by_scan(client: Any) -> tuple[list[str], list[str]]:
    """The same refresh as before the registries: semaphores and queues found by SCAN
    (the code of ``dashboard/snapshot.py`` before, its rows' reads included)."""
    from stock_locks import DelayQueue
    from stock_locks.backends.redis.errors import translated
    from stock_locks.backends.redis.protocol import decoded
    from stock_locks.conf import settings
    from stock_locks.dashboard.snapshot import charts, lock_page
    from stock_locks.dashboard.timeline import recent
    from stock_locks.keys import unescape_name
    from stock_locks.operations import semaphore_state

    prefix = settings.key_prefix()
    with translated():
        charts(recent(300, client))  # the default window's timeline
        lock_page("", 1, client)
        head = f"{prefix}:sem:{{"
        found = set()
        for key in client.scan_iter(match=f"{head}*}}", count=1000):
            key = decoded(key)
            if key.startswith(head) and key.endswith("}"):
                found.add(unescape_name(key[len(head) : -1]))
        names = sorted(found)[:100]
        for name in names:
            semaphore_state(name, redis=client)
        queues = set(settings.DELAY_QUEUES)
        head = f"{prefix}:dq:{{"
        for key in client.scan_iter(match=f"{head}*}}:items", count=1000):
            queues.add(unescape_name(decoded(key)[len(head) : -len("}:items")]))
        for queue in sorted(queues):
            DelayQueue(queue, redis=client).stats()
            DelayQueue(queue, redis=client).dead_letters(20)
    return names, sorted(queues)


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = call()
    return (time.perf_counter() - start) * 1000, result


def refresh_cost(args: Any) -> tuple[list[str], bool]:
    from stock_locks.backends.redis import get_redis, registry

    client = get_redis()
    client.flushdb()
    registry.forget()  # (what an earlier benchmark of this run registered is gone)
    held = _seed_shown(client)
    contenders = {"registries (now)": _refresh, "SCAN (before)": _refresh_by_scan}
    sizes = QUICK_SIZES if args.quick else SIZES
    medians: dict[str, dict[int, float]] = {name: {} for name in contenders}
    filled = 0
    for size in sizes:
        _fill(client, filled, size)
        filled = size
        support.progress(f"dashboard: {size:,} unrelated keys")
        times: dict[str, list[float]] = {name: [] for name in contenders}
        listed = set()
        for r in range(args.repeats):
            for name in support.rotated(list(contenders), r):
                ms, names = _timed(lambda call=contenders[name]: call(client))
                times[name].append(ms)
                listed.add((tuple(names[0]), tuple(names[1])))
        if len(listed) != 1:
            raise RuntimeError(f"the two refreshes listed different rows: {listed}")
        for name in contenders:
            medians[name][size] = support.median(times[name])
    for holder in held:
        holder.release()
    keys = client.dbsize()
    client.flushdb()
    rows = []
    for name in contenders:
        base = medians[name][0]
        rows.append(
            [name]
            + [f"{medians[name][size]:.1f}" for size in sizes]
            + [f"{medians[name][sizes[-1]] / base:.2f}x"]
        )
    support.figure("dashboard refresh ms by keys", {name: medians[name] for name in contenders})
    largest = sizes[-1]
    ratio = medians["registries (now)"][largest] / medians["registries (now)"][0]
    ok = ratio <= TARGET_RATIO
    lines = [
        f"a. One dashboard refresh (its Redis reads: charts, held locks, semaphores, delay "
        f"queues), ms, median of {args.repeats}; {SEMAPHORES} semaphores held, a queue of "
        f"{QUEUED} items and a dead letter, {HELD_LOCKS} held locks, among N unrelated keys "
        f"(order fence counters; {keys:,} keys at the end)",
        "",
        support.table(
            ["found by"]
            + [f"{size // 1000}k keys" if size else "0 keys" for size in sizes]
            + [f"{largest // 1000}k / 0"],
            rows,
        ),
        "",
        f"target: refresh at {largest // 1000}k keys / 0 keys <= {TARGET_RATIO}x: "
        f"{ratio:.2f}x: {support.verdict(ok)}",
    ]
    return lines, ok


# -- b. fence counters ---------------------------------------------------------------


def _grant_and_release(client: Any, orders: int) -> None:
    """Order locks ``order:0``..``order:N-1`` granted and released once each, by the
    scripts Lock runs, pipelined."""
    from stock_locks import scripts
    from stock_locks.backends.redis.protocol import (
        acquire_argv,
        acquire_keys,
        holder_argv,
        release_argv,
        release_keys,
    )
    from stock_locks.keys import lock_keys

    ttl_ms = 30_000
    holder = holder_argv("benchmarks.dashboard", False)
    for source in (scripts.LOCK_ACQUIRE, scripts.LOCK_RELEASE):
        client.script_load(source.script)
    for chunk in range(0, orders, FILL_CHUNK):
        pipe = client.pipeline(transaction=False)
        for n in range(chunk, min(chunk + FILL_CHUNK, orders)):
            keys = lock_keys(f"order:{n}")
            token = f"{n:032x}"
            grant = acquire_keys(keys)
            pipe.evalsha(scripts.LOCK_ACQUIRE.sha, len(grant), *grant,
                         *acquire_argv(token, ttl_ms, 0, holder, False))  # fmt: skip
            release = release_keys(keys)
            pipe.evalsha(scripts.LOCK_RELEASE.sha, len(release), *release,
                         *release_argv(token, 1))  # fmt: skip
        for reply in pipe.execute()[::2]:
            if int(reply[0]) != 1:
                raise RuntimeError(f"an order lock was not granted: {reply!r}")


def _used_memory(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def _fence_ttls(client: Any, orders: int) -> list[float]:
    from stock_locks.keys import lock_keys

    # The fence is kept by the lock key's tombstone and (a floor) by the :fence key: the
    # longer of the two.
    pipe = client.pipeline(transaction=False)
    for n in range(0, orders, max(1, orders // 100)):
        keys = lock_keys(f"order:{n}")
        pipe.pttl(keys.lock)
        pipe.pttl(keys.fence)
    replies = pipe.execute()
    return [max(a, b) / 1000 for a, b in zip(replies[::2], replies[1::2], strict=True)]


def fence_memory(args: Any) -> list[str]:
    from stock_locks.backends.redis import get_redis
    from stock_locks.conf import settings

    client = get_redis()
    rows = []
    for label, retention in (("a day after the last grant (before)", OLD_RETENTION),
                             ("a minute after the clock passed it (now)", 60)):  # fmt: skip
        override = support.configure_stock_locks(FENCE_RETENTION=retention)
        try:
            support.progress(f"fence counters: FENCE_RETENTION={retention}")
            client.flushdb()
            before = _used_memory(client)
            _grant_and_release(client, args.orders)
            after_cycles = _used_memory(client)
            # What is left is the fences' (the tombstone, which also carries the released
            # tokens, and the :fence floor): nothing to leave out.
            fences = _used_memory(client) - before
            ttls = _fence_ttls(client, args.orders)
            # Kept for `keep` seconds after an order's last grant: at a million orders a
            # day, a million / DAY * keep counters at once (all of a day's, at most).
            keep = min(support.median(ttls), DAY) if ttls else 0
            million_a_day = min(1_000_000, 1_000_000 / DAY * keep) * fences / args.orders
            rows.append([
                label, f"{(after_cycles - before) / args.orders:.0f}",
                f"{fences / args.orders:.0f}", f"{keep:,.0f}",
                f"{million_a_day / 1e6:.2f}",
            ])  # fmt: skip
        finally:
            override.disable()
    lines = [
        f"b. Fence counters: {args.orders:,} order locks granted and released once each "
        f"(lease 30 s); Redis used_memory per order, the counters' TTL (median of 100) and "
        "what a million orders a day keep",
        "",
        support.table(
            [
                "FENCE_RETENTION",
                "B/order after release",
                "B/fence counter",
                "counter TTL s",
                "MB held, 1M orders/day",
            ],
            rows,
        ),
    ]
    if not args.quick:
        lines += ["", _expired(client, args.orders)]
    client.flushdb()
    lines += [f"(FENCE_RETENTION default now: {settings.FENCE_RETENTION} s.)"]
    return lines


def _expired(client: Any, orders: int) -> str:
    """The memory of ``orders`` order locks' keys once the fence counters expired."""
    from stock_locks.keys import lock_keys

    override = support.configure_stock_locks(FENCE_RETENTION=60)
    try:
        client.flushdb()
        before = _used_memory(client)
        _grant_and_release(client, orders)
        granted = time.monotonic()
        grown = _used_memory(client) - before
        every = max(1, orders // 100)
        # each sampled order's lock key (its tombstone) and :fence key
        sample = [key for n in range(0, orders, every) for key in lock_keys(f"order:{n}")[:2]]
        support.progress("fence counters: waiting for them to expire (about a minute)")
        while client.exists(*sample) and time.monotonic() < granted + 180:
            time.sleep(1)  # Redis expires them on its own clock; we only look
        left = client.exists(*sample)
        waited = time.monotonic() - granted
    finally:
        override.disable()
    return (
        f"FENCE_RETENTION 60: after the grants used_memory {grown / 1e6:+.1f} MB; "
        f"{waited:.0f} s later {left} of {len(sample)} sampled counters left, used_memory "
        f"{(_used_memory(client) - before) / 1e6:+.2f} MB against before the grants."
    )


def main(argv: list[str]) -> str:
    args = parse_args(argv)
    sections = set(args.only or "ab")
    load_before = support.load_average()
    with support.private_redis() as server:
        support.setup_django(server.url)
        lines = support.header("Dashboard benchmark", server, ("redis", "Django"), args.quick)
        if "a" in sections:
            part, _ = refresh_cost(args)
            lines += [""] + part
        if "b" in sections:
            lines += [""] + fence_memory(args)
        lines += ["", support.load_line(load_before)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(main(sys.argv[1:]))
