"""Force release when a reply is lost (issue 9): the release ran on the server,
its reply was dropped on the way back; the repeat must still name the holder it
displaced, and that holder must still be told it lost the lock."""

from __future__ import annotations

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from stock_locks import Lock, scripts
from stock_locks.exceptions import LockNotOwned
from stock_locks.operations import force_release
from tests.support.fault_proxy import RETRIES
from tests.support.lock_state import held


@RETRIES
def test_a_force_release_whose_reply_was_lost_still_returns_the_holder(
    retries, redis_server, redis_client, fault_proxy
):
    holder = Lock("forced", ttl=300)
    holder.acquire()
    for script in (scripts.LOCK_RELEASE, scripts.LOCK_INSPECT):
        redis_client.script_load(script.script)  # no SCRIPT LOAD through the proxy
    proxy = fault_proxy(redis_server.port)
    client = redis.Redis(port=proxy.port, retry=Retry(NoBackoff(), retries))
    proxy.lose_reply(scripts.LOCK_RELEASE.sha.encode())  # the release, not the read
    displaced = force_release("forced", redis=client)
    assert proxy.lost == 1
    assert displaced is not None and displaced.token == holder.token
    assert not held(redis_client, holder.keys.lock)
    with pytest.raises(LockNotOwned):
        holder.release()  # the repeat did not make the holder's own release look done
