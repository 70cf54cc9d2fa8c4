-- Give a fair semaphore's permit back, or leave its queue, and wake the waiters
-- this lets in.
--
-- KEYS[1..6] as for fair_acquire.lua: holders, meta, queue, alive, ticket
--            counter, wake-up prefix (a waiter's list is the prefix + its id;
--            declared as a prefix because which waiter to wake is decided here)
-- ARGV[1] id   ARGV[2] limit   ARGV[3] how long an unclaimed wake-up lasts, ms
--
-- Also takes the id out of the queue, so a waiter that gives up without a last
-- try (an error while it waited) leaves with this script. Ended leases and
-- lapsed places are removed too, so a wake-up goes to a live waiter.
-- Returns 1 when the id held a live permit. Returns 0 when it held none, or its
-- lease had already ended on the Redis clock (its permit was already free to
-- others); its entry and metadata are removed all the same.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local holders, meta, queue, alive, tickets, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, limit, grace = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

-- The waiters that may take a permit now: the first (limit - holders) in line.
local function admissible()
  local free = limit - redis.call('ZCARD', holders)
  if free <= 0 then
    return {}
  end
  return redis.call('ZRANGE', queue, 0, free - 1)
end

local before = admissible()
local lease_end = redis.call('ZSCORE', holders, id)
if lease_end then
  redis.call('ZREM', holders, id)
  redis.call('HDEL', meta, id)
end
redis.call('ZREM', queue, id)
redis.call('ZREM', alive, id)
redis.call('DEL', wake .. id)
for _, ended in ipairs(redis.call('ZRANGEBYSCORE', holders, '-inf', now)) do
  redis.call('ZREM', holders, ended)
  redis.call('HDEL', meta, ended)
end
for _, lapsed in ipairs(redis.call('ZRANGEBYSCORE', alive, '-inf', now)) do
  redis.call('ZREM', alive, lapsed)
  redis.call('ZREM', queue, lapsed)
  redis.call('DEL', wake .. lapsed)
end

-- Wake each waiter that may take a permit now but could not before.
local was = {}
for _, waiter in ipairs(before) do
  was[waiter] = true
end
for _, waiter in ipairs(admissible()) do
  if not was[waiter] then
    redis.call('RPUSH', wake .. waiter, 1)
    redis.call('LTRIM', wake .. waiter, 0, 0)
    redis.call('PEXPIRE', wake .. waiter, grace)
  end
end

if redis.call('EXISTS', holders, queue) == 0 then
  redis.call('DEL', meta, tickets)  -- nobody holds or waits: nothing left to describe
end
if lease_end and tonumber(lease_end) > now then
  return 1
end
return 0
