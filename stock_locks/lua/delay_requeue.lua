-- Give a dead letter another round of deliveries, due now.
--
-- KEYS[1] due zset   KEYS[2] attempts hash   KEYS[3] dead zset
-- ARGV[1] id
-- Returns 1 when the item was dead and is due again, 0 otherwise.
if redis.call('ZREM', KEYS[3], ARGV[1]) == 0 then
  return 0
end
-- include lib/now.lua
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[1], now, ARGV[1])
return 1
