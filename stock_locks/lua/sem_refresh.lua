-- Renew the lease of a semaphore holder, if it has not ended yet.
--
-- KEYS[1] holders (zset: holder id -> when its lease ends, ms on the Redis clock)
-- KEYS[2..n] the semaphore's other keys: each is kept at least as long as the
--            new lease (they expire after the last lease, see *_acquire.lua)
-- ARGV[1] holder id   ARGV[2] new lease in ms, counted from now
--
-- Returns 1 when renewed. Returns 0 when the id holds no permit or its lease has
-- ended on the Redis clock, even if no acquire has removed it yet: from then on
-- its permit was free to others, so renewing it could let limit + 1 in.
-- include lib/now.lua

local lease_end = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not lease_end or tonumber(lease_end) <= now then
  return 0
end
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
for i = 1, #KEYS do
  local pttl = redis.call('PTTL', KEYS[i])
  if pttl >= 0 and pttl < lease then
    redis.call('PEXPIRE', KEYS[i], lease)
  end
end
return 1
