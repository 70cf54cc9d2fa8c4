"""The Lua scripts, loaded once from ``stock_locks/lua/`` and run by SHA.

Each script is a ``redis.commands.core.Script`` built from the file's bytes, so
it is bound to no client: call it with ``client=`` (a client or a pipeline).
A server that does not know a script (it restarted, or is a new primary) is
sent its source (``stock_locks.backends.redis.requests``), so it needs no
preparation. An asyncio client can run the same source through
``redis.commands.core.AsyncScript(None, script.script)``.
"""

from __future__ import annotations

import re
from importlib import resources

from redis.commands.core import Script

# A line "-- include <path>.lua" (a path under lua/, such as lib/now.lua) is replaced
# by that file when loading, so Lua shared by several scripts is written once; each
# script stays one EVALSHA. An included file's own include lines are not expanded.
_INCLUDE = re.compile(rb"^-- include ((?:\w+/)*\w+\.lua)\n", re.MULTILINE)


def _read(filename: str) -> bytes:
    return resources.files(__package__).joinpath("lua", filename).read_bytes()


# A script whose first line is not a shebang gets "#!lua": it declares that it may write
# (those that only read say "#!lua flags=no-writes" themselves). Redis (>= 7.0)
# then refuses it before it runs on a replica (READONLY: a demoted primary, a stale
# connection after a failover), on a primary short of min-replicas-to-write
# (NOREPLICAS) and when out of memory. Without it a script runs until its first write,
# so a branch that only reads (a release finding no lock, a reserve finding no stock)
# would answer from a replica's stale copy as if it were the primary's.
_WRITES = b"#!lua\n"


def load(name: str) -> Script:
    """The script in ``lua/<name>.lua``, its includes expanded, its flags declared."""
    source = _INCLUDE.sub(lambda match: _read(match[1].decode()), _read(f"{name}.lua"))
    if not source.startswith(b"#!"):
        source = _WRITES + source
    return Script(None, source)  # type: ignore[arg-type]  # every call passes client=


LOCK_ACQUIRE = load("lock_acquire")
LOCK_RELEASE = load("lock_release")
LOCK_EXTEND = load("lock_extend")
LOCK_INSPECT = load("lock_inspect")
LOCK_FENCE = load("lock_fence")
DELAY_SCHEDULE = load("delay_schedule")
DELAY_CLAIM = load("delay_claim")
DELAY_ACK = load("delay_ack")
DELAY_FAIL = load("delay_fail")
DELAY_REMOVE = load("delay_remove")
DELAY_REQUEUE = load("delay_requeue")
DELAY_RELEASE = load("delay_release")
DELAY_STATS = load("delay_stats")
STOCK_RESERVE = load("stock_reserve")
STOCK_RELEASE = load("stock_release")
STOCK_COMMIT = load("stock_commit")
STOCK_ADOPT = load("stock_adopt")
STOCK_CORRECT = load("stock_correct")
STOCK_LOAD = load("stock_load")
STOCK_CONFIRM_JOIN = load("stock_confirm_join")
STOCK_CONFIRM_PASS = load("stock_confirm_pass")
SEM_ACQUIRE = load("sem_acquire")
SEM_RELEASE = load("sem_release")
SEM_REFRESH = load("sem_refresh")
SEM_STATE = load("sem_state")
FAIR_ACQUIRE = load("fair_acquire")
FAIR_RELEASE = load("fair_release")
REGISTRY_TOUCH = load("registry_touch")
REGISTRY_READ = load("registry_read")
WAITINGROOM_VISIT = load("waitingroom_visit")
WAITINGROOM_ADMIT = load("waitingroom_admit")
WAITINGROOM_TOUCH = load("waitingroom_touch")
WAITINGROOM_LEAVE = load("waitingroom_leave")


METRICS_FLUSH = load("metrics_flush")

_BY_SHA = {script.sha: script for script in list(globals().values()) if isinstance(script, Script)}


def by_sha(sha: str) -> Script:
    """The script whose SHA1 is ``sha`` (KeyError for one stock_locks does not load)."""
    return _BY_SHA[sha]
