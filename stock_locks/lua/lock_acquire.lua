-- Grant a lock, or re-grant it to the token that already holds it.
--
-- KEYS[1] lock key (string: the holder's token, expiring with the lease)
-- KEYS[2] fencing counter (the last fence granted; expires ARGV[10] ms after the
--         last grant)
-- KEYS[3] holder hash (metadata for the admin page, same lease as the lock)
-- KEYS[4] held-locks index (zset lock key -> lease end, ms; one per hash slot on a cluster)
-- KEYS[5] released tokens (list, newest first; see lock_release.lua)
-- ARGV[1] token          ARGV[2] lease in ms
-- ARGV[3] depth: how many times this token already holds the lock (0 = fresh)
-- ARGV[4] thread  ARGV[5] host  ARGV[6] pid  ARGV[7] caller  ARGV[8] watchdog "1"/"0"
-- ARGV[9] "1" when the caller waited before this try, else "0"
-- ARGV[10] fencing counter retention in ms
-- ARGV[11] (optional) fence rule: 'clock' (default) or 'counter' (RedLock: see below)
--
-- Returns {1, fence, count} when granted. A token that already holds the lock
-- is granted again (count = depth + 1), so a retried call whose reply was lost
-- gets the same answer instead of stranding the lock.
-- Returns {0, pttl} when another token holds it: pttl is the holder's remaining
-- lease in ms (-1 when the key has no expiry), the longest a waiter must wait.
-- A refusal marks the holder hash 'waiters', so that its release wakes one.
-- A grant to a caller that waited keeps the mark: others may still be waiting,
-- and its own release must wake the next of them.
-- Returns {2} for a re-entry (depth > 0) whose token no longer holds the lock
-- (its lease ran out, or it was force-released): nothing is granted.
-- Returns {3} for a token already released or given up (a late copy of a try
-- whose caller gave the lock back): nothing is granted.
--
-- A fresh grant's fence is max(last fence + 1, Redis clock in microseconds):
-- fences rise across a restart that lost the counter and across a restore from
-- an older snapshot (whose counter is behind), so the counter may expire.
-- With ARGV[11] 'counter' it is last fence + 1, and the clock only when the
-- counter is missing: RedLock's masters then agree on the fence of a grant, and
-- its client needs no second round trip to make them agree (backends/redlock.py).
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
if ARGV[3] == '0' and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if redis.call('LPOS', KEYS[5], ARGV[1]) then
    redis.call('DEL', KEYS[1])
    return {3}
  end
  local fence = now[1] .. string.format('%06d', now[2])
  if ARGV[11] == 'counter' then
    local last = redis.call('GET', KEYS[2])
    if last then
      fence = string.format('%d', tonumber(last) + 1)
    end
    redis.call('SET', KEYS[2], fence, 'PX', ARGV[10])
  else
    -- The clock is almost always ahead: write it, and look at what was there.
    local last = redis.call('SET', KEYS[2], fence, 'PX', ARGV[10], 'GET')
    if last and tonumber(last) >= tonumber(fence) then
      fence = string.format('%d', tonumber(last) + 1)
      redis.call('SET', KEYS[2], fence, 'PX', ARGV[10])
    end
  end
  redis.call('HSET', KEYS[3],
    'token', ARGV[1], 'fence', fence, 'count', 1, 'ttl', ARGV[2],
    'acquired_at', now_ms,
    'thread', ARGV[4], 'host', ARGV[5], 'pid', ARGV[6], 'caller', ARGV[7],
    'watchdog', ARGV[8], 'waiters', ARGV[9])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  redis.call('ZADD', KEYS[4], now_ms + tonumber(ARGV[2]), KEYS[1])
  if now[2] % 64 == 0 then
    -- Now and then, drop the entries of leases that ended without a release.
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now_ms)
  end
  return {1, tonumber(fence), 1}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local count = tonumber(ARGV[3]) + 1
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[3], 'count', count)
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  redis.call('ZADD', KEYS[4], now_ms + tonumber(ARGV[2]), KEYS[1])
  local fence = redis.call('HGET', KEYS[3], 'fence') or redis.call('GET', KEYS[2])
  return {1, tonumber(fence), count}
end
if ARGV[3] ~= '0' then
  return {2}
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HSET', KEYS[3], 'waiters', 1)
end
return {0, redis.call('PTTL', KEYS[1])}
