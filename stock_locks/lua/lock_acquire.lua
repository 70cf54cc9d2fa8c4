-- Grant a lock, or re-grant it to the token that already holds it.
--
-- KEYS[1] lock key (string: the holder's token, expiring with the lease)
-- KEYS[2] fencing counter (never expires; INCR on every fresh grant). A missing
--         counter (first grant, or Redis lost its data) starts from the Redis
--         clock in microseconds, so fences keep rising across a data loss
--         (unless grants outpace one per microsecond, or the clock steps back).
-- KEYS[3] holder hash (metadata for the admin page, same lease as the lock)
-- ARGV[1] token          ARGV[2] lease in ms
-- ARGV[3] depth: how many times this token already holds the lock (0 = fresh)
-- ARGV[4] thread  ARGV[5] host  ARGV[6] pid  ARGV[7] caller  ARGV[8] watchdog "1"/"0"
-- ARGV[9] "1" when the caller waited before this try, else "0"
--
-- Returns {1, fence, count} when granted. A token that already holds the lock
-- is granted again (count = depth + 1), so a retried call whose reply was lost
-- gets the same answer instead of stranding the lock.
-- Returns {0, pttl} when another token holds it: pttl is the holder's remaining
-- lease in ms (-1 when the key has no expiry), the longest a waiter must wait.
-- A refusal marks the holder hash 'waiters', so that its release wakes one.
-- A grant to a caller that waited keeps the mark: others may still be waiting,
-- and its own release must wake the next of them.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local now = redis.call('TIME')
  local fence = redis.call('INCR', KEYS[2])
  if fence == 1 then
    fence = now[1] * 1000000 + now[2]
    redis.call('SET', KEYS[2], fence)
  end
  redis.call('HSET', KEYS[3],
    'token', ARGV[1], 'fence', fence, 'count', 1, 'ttl', ARGV[2],
    'acquired_at', now[1] * 1000 + math.floor(now[2] / 1000),
    'thread', ARGV[4], 'host', ARGV[5], 'pid', ARGV[6], 'caller', ARGV[7],
    'watchdog', ARGV[8], 'waiters', ARGV[9])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return {1, fence, 1}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local count = tonumber(ARGV[3]) + 1
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[3], 'count', count)
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  local fence = redis.call('HGET', KEYS[3], 'fence') or redis.call('GET', KEYS[2])
  return {1, tonumber(fence), count}
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HSET', KEYS[3], 'waiters', 1)
end
return {0, redis.call('PTTL', KEYS[1])}
