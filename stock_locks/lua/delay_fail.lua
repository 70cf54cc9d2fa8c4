-- Record a failed delivery: retry the item later, or bury it in the dead-letter set.
--
-- KEYS[1] due zset   KEYS[2] attempts hash   KEYS[3] errors hash
-- KEYS[4] in-flight zset   KEYS[5] dead zset
-- ARGV[1] id   ARGV[2] error text   ARGV[3] retry delay ms   ARGV[4] max deliveries
--
-- Returns 1 when it will be retried, 2 when it went to the dead-letter set,
-- 0 when it was not in flight (acknowledged, cancelled or rescheduled: nothing changed).
if redis.call('ZREM', KEYS[4], ARGV[1]) == 0 then
  return 0
end
-- include lib/now.lua
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
-- No entry: the first delivery (see delay_claim.lua). Written now, for retries and dead letters.
local deliveries = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or 1)
redis.call('HSET', KEYS[2], ARGV[1], deliveries)
if deliveries >= tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[5], now, ARGV[1])
  return 2
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return 1
