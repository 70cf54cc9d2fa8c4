-- Grant a lock, or re-grant it to the token that already holds it.
--
-- KEYS[1] lock key (string: the holder's token, expiring with the lease)
-- KEYS[2] fencing counter (never expires; INCR on every fresh grant)
-- KEYS[3] holder hash (metadata for the admin page, same lease as the lock)
-- ARGV[1] token          ARGV[2] lease in ms
-- ARGV[3] depth: how many times this token already holds the lock (0 = fresh)
-- ARGV[4] host  ARGV[5] pid  ARGV[6] thread  ARGV[7] caller  ARGV[8] watchdog "1"/"0"
--
-- Returns {1, fence, count} when granted. A token that already holds the lock
-- is granted again (count = depth + 1), so a retried call whose reply was lost
-- gets the same answer instead of stranding the lock.
-- Returns {0, pttl} when another token holds it: pttl is the holder's remaining
-- lease in ms (-1 when the key has no expiry), the longest a waiter must wait.
local holder = redis.call('GET', KEYS[1])
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  local fence = redis.call('INCR', KEYS[2])
  local now = redis.call('TIME')
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[3],
    'token', ARGV[1], 'fence', fence, 'count', 1, 'ttl', ARGV[2],
    'acquired_at', now[1] * 1000 + math.floor(now[2] / 1000),
    'host', ARGV[4], 'pid', ARGV[5], 'thread', ARGV[6], 'caller', ARGV[7],
    'watchdog', ARGV[8])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return {1, fence, 1}
end
if holder == ARGV[1] then
  local count = tonumber(ARGV[3]) + 1
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[3], 'count', count)
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  local fence = redis.call('HGET', KEYS[3], 'fence') or redis.call('GET', KEYS[2])
  return {1, tonumber(fence), count}
end
return {0, redis.call('PTTL', KEYS[1])}
