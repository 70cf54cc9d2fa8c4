-- Shared by fair_acquire.lua and fair_release.lua, included where this line
-- stands in them: "-- include lib/fair_queue.lua" (stock_locks/scripts.py).
-- Defines the local functions sweep() and wake_due(). Uses their locals now (ms,
-- lib/now.lua), holders, meta, queue, alive, wake, id, limit and grace.

-- Remove ended leases and lapsed places, so that a turn goes to a live waiter.
local function sweep()
  for _, ended in ipairs(redis.call('ZRANGEBYSCORE', holders, '-inf', now)) do
    redis.call('ZREM', holders, ended)
    redis.call('HDEL', meta, ended)
  end
  for _, lapsed in ipairs(redis.call('ZRANGEBYSCORE', alive, '-inf', now)) do
    redis.call('ZREM', alive, lapsed)
    redis.call('ZREM', queue, lapsed)
    redis.call('DEL', wake .. lapsed)
  end
end

-- Only the first `limit` waiters can be let in by ended leases alone: the one
-- at rank r at once when r < free (= limit - holders), else when the
-- (r - free + 1)-th soonest lease ends. Anyone behind them needs one of them to
-- take a permit or leave first, which runs this code again. So whenever the
-- holders or the queue change, a waiter among the first `limit` whose turn can
-- now come before its planned next try (its place's lapse minus the grace) is
-- woken, and its place is kept for a grace from now (it tries on waking; this
-- also marks it as told, so it is not woken twice for the same turn).
local function wake_due()
  local line = redis.call('ZRANGE', queue, 0, limit - 1)
  if #line == 0 then
    return
  end
  local ends = redis.call('ZRANGE', holders, 0, -1, 'WITHSCORES')
  local free = limit - #ends / 2
  for rank = 0, #line - 1 do
    local waiter = line[rank + 1]
    if waiter ~= id then
      local due = now
      if rank >= free then
        due = tonumber(ends[2 * (rank - free) + 2]) + 1
      end
      local place = tonumber(redis.call('ZSCORE', alive, waiter) or 0)
      if due < place - grace then
        redis.call('RPUSH', wake .. waiter, 1)
        redis.call('LTRIM', wake .. waiter, 0, 0)
        redis.call('PEXPIRE', wake .. waiter, grace)
        redis.call('ZADD', alive, now + grace, waiter)
      end
    end
  end
end
