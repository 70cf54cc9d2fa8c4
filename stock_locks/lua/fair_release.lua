-- Give a fair semaphore's permit back, or leave its queue, and wake the waiters
-- whose turn this brings forward.
--
-- KEYS[1..6] as for fair_acquire.lua: holders, meta, queue, alive, ticket
--            counter, wake-up prefix (a waiter's list is the prefix + its id;
--            declared as a prefix because which waiter to wake is decided here)
-- KEYS[7] gone (zset: id -> until when it counts as given back, ms); optional:
--         without it (an operator's eviction) nothing is remembered
-- ARGV[1] id   ARGV[2] limit
-- ARGV[3] grace, ms, as for fair_acquire.lua (every caller passes the same)
-- ARGV[4] how long a given-back id is remembered in KEYS[7], ms (the lease)
-- ARGV[5] 'abandon' after an acquire that failed or was interrupted: the id is
--         remembered whatever it held, so that a late copy of that acquire
--         (still on its way when its caller gave up) is refused
--
-- Also takes the id out of the queue, so a waiter that gives up without a last
-- try (an error while it waited) leaves with this script. Ended leases and
-- lapsed places are removed too, so a wake-up goes to a live waiter.
-- Safe to repeat: a release remembers the id when it gave back a live permit,
-- and a repeat (redis-py retrying a call whose reply was lost) finds it there.
-- Returns 1 when the id held a live permit, or this is a repeat of a release
-- that returned 1. Returns 0 when it held none, or its lease had already ended
-- on the Redis clock (its permit was already free to others); its entry and
-- metadata are removed all the same.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local holders, meta, queue, alive, tickets, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local gone = KEYS[7]
local id, limit, grace = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local function remember()
  if not gone then
    return
  end
  local memory = tonumber(ARGV[4])
  redis.call('ZADD', gone, now + memory, id)
  if redis.call('PTTL', gone) < memory then
    redis.call('PEXPIRE', gone, memory)
  end
end

-- As in fair_acquire.lua: wake each waiter among the first `limit` whose turn
-- can now come before its planned next try, and keep its place a grace from now.
local function wake_due()
  local line = redis.call('ZRANGE', queue, 0, limit - 1)
  if #line == 0 then
    return
  end
  local ends = redis.call('ZRANGE', holders, 0, -1, 'WITHSCORES')
  local free = limit - #ends / 2
  for rank = 0, #line - 1 do
    local waiter = line[rank + 1]
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

local repeated = false
if gone then
  redis.call('ZREMRANGEBYSCORE', gone, '-inf', now)
  repeated = redis.call('ZSCORE', gone, id) ~= false
end
if ARGV[5] == 'abandon' then
  remember()
end

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
wake_due()

if redis.call('EXISTS', holders, queue) == 0 then
  redis.call('DEL', meta, tickets)  -- nobody holds or waits: nothing left to describe
end
if lease_end and tonumber(lease_end) > now then
  remember()
  return 1
end
if not lease_end and repeated then
  return 1
end
return 0
