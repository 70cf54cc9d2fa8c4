"""The Lua scripts, loaded once from ``stock_locks/lua/`` and run by SHA.

Each script is a ``redis.commands.core.Script`` built from the file's bytes, so
it is bound to no client: call it with ``client=`` (a client or a pipeline).
EVALSHA falls back to SCRIPT LOAD on NOSCRIPT, so a restarted or new server
needs no preparation. An asyncio client can run the same source through
``redis.commands.core.AsyncScript(None, script.script)``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError

# A line "-- include <path>.lua" (a path under lua/, such as lib/now.lua) is replaced
# by that file when loading, so Lua shared by several scripts is written once; each
# script stays one EVALSHA. An included file's own include lines are not expanded.
_INCLUDE = re.compile(rb"^-- include ((?:\w+/)*\w+\.lua)\n", re.MULTILINE)


def _read(filename: str) -> bytes:
    return resources.files(__package__).joinpath("lua", filename).read_bytes()


def load(name: str) -> Script:
    """The script in ``lua/<name>.lua``, its includes expanded."""
    source = _INCLUDE.sub(lambda match: _read(match[1].decode()), _read(f"{name}.lua"))
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


def run_batch(client: Any, calls: Sequence[tuple[Script, Sequence, Sequence]]) -> list:
    """Run several script calls in one round trip (a non-transactional pipeline).

    Returns one reply per call; a call that failed inside Redis gives its
    exception object instead of raising. When the server does not know a script
    (it restarted), the scripts are loaded and the whole batch runs once more,
    so every call in a batch must be safe to repeat.
    """
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        results = pipe.execute(raise_on_error=False)
        missing = {id(calls[i][0]): calls[i][0] for i, r in enumerate(results) if _noscript(r)}
        if not missing or attempt:
            return results
        for script in missing.values():
            client.script_load(script.script)
    return results


def _noscript(reply: object) -> bool:
    return isinstance(reply, NoScriptError)


METRICS_FLUSH = load("metrics_flush")
