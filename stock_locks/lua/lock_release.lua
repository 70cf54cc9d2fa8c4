-- Release a lock held by a token, and wake one waiter if any was refused.
--
-- KEYS[1] lock key   KEYS[2] holder hash   KEYS[3] wake-up signal list
-- ARGV[1] token
-- ARGV[2] depth: how many times the token holds the lock (1 unless reentrant)
-- ARGV[3] how long the wake-up signal waits for a waiter, ms
--
-- Returns 1 when the lock was freed, 2 when a reentrant hold was only
-- decremented (still held), 0 when the token does not hold it (nothing changed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local depth = tonumber(ARGV[2])
if depth > 1 then
  redis.call('HSET', KEYS[2], 'count', depth - 1)
  return 2
end
local waiters = redis.call('HGET', KEYS[2], 'waiters')
redis.call('DEL', KEYS[1], KEYS[2])
if waiters ~= '0' then
  -- One element: a release wakes one waiter, whose own release wakes the next.
  -- (A missing hash reads as "maybe waiters": wake one rather than risk none.)
  redis.call('DEL', KEYS[3])
  redis.call('RPUSH', KEYS[3], 1)
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
return 1
