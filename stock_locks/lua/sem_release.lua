-- Give a semaphore's permit back, and wake a waiter if any may be waiting.
--
-- KEYS[1] holders (zset)   KEYS[2] meta (hash)   KEYS[3] wake-up signal list
-- ARGV[1] holder id
-- ARGV[2] limit: the most wake-ups the signal list keeps (never more than permits)
-- ARGV[3] how long an unclaimed wake-up lasts, ms
--
-- Returns 1 when the id held a live permit. Returns 0 when it held none, or its
-- lease had already ended on the Redis clock (its permit was already free to
-- others); its entry and metadata are removed all the same.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)

local lease_end = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not lease_end then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
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
return 1
