-- Give a semaphore's permit back, and wake a waiter if any may be waiting.
--
-- KEYS[1] holders (zset)   KEYS[2] meta (hash)   KEYS[3] wake-up signal list
-- KEYS[4] gone (zset: holder id -> until when it counts as given back, ms);
--         optional: without it (an operator's eviction) nothing is remembered
-- ARGV[1] holder id
-- ARGV[2] limit: the most wake-ups the signal list keeps (never more than permits)
-- ARGV[3] how long an unclaimed wake-up lasts, ms
-- ARGV[4] how long a given-back id is remembered in KEYS[4], ms (the lease)
-- ARGV[5] 'abandon' after an acquire that failed or was interrupted: the id is
--         remembered whatever it held, so that a late copy of that acquire
--         (still on its way when its caller gave up) is refused
--
-- Safe to repeat: a release remembers the id when it gave back a live permit,
-- and a repeat (redis-py retrying a call whose reply was lost) finds it there.
-- Returns 1 when the id held a live permit, or this is a repeat of a release
-- that returned 1. Returns 0 when it held none, or its lease had already ended
-- on the Redis clock (its permit was already free to others); its entry and
-- metadata are removed all the same.
-- include lib/now.lua
local id, gone = ARGV[1], KEYS[4]
local memory, abandon = tonumber(ARGV[4]), ARGV[5] == 'abandon'

-- include lib/given_back.lua

local lease_end = redis.call('ZSCORE', KEYS[1], id)
if not lease_end then
  if repeated then
    return 1
  end
  return 0
end
redis.call('ZREM', KEYS[1], id)
redis.call('HDEL', KEYS[2], id)
local waiting = tonumber(redis.call('HGET', KEYS[2], 'waiting') or 0)
if waiting > now then
  -- One wake-up per freed permit: a waiter refused again (someone else took the
  -- permit first) goes back to sleep, bounded by the next lease end.
  redis.call('RPUSH', KEYS[3], 1)
  redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[2]) - 1)
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
elseif redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[2])  -- no holder, nobody waiting: nothing left to describe
end
if tonumber(lease_end) <= now then
  return 0
end
remember()
return 1
