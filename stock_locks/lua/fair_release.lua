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
-- include lib/now.lua
local holders, meta, queue, alive, tickets, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local gone = KEYS[7]
local id, limit, grace = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local memory, abandon = tonumber(ARGV[4]), ARGV[5] == 'abandon'

-- include lib/fair_queue.lua

-- include lib/given_back.lua

local lease_end = redis.call('ZSCORE', holders, id)
if lease_end then
  redis.call('ZREM', holders, id)
  redis.call('HDEL', meta, id)
end
redis.call('ZREM', queue, id)
redis.call('ZREM', alive, id)
redis.call('DEL', wake .. id)
sweep()
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
