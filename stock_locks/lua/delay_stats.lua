#!lua flags=no-writes
-- Counts and next times of a delay queue, read against the Redis clock.
--
-- KEYS[1] due zset   KEYS[2] in-flight zset   KEYS[3] dead zset
-- Returns {now ms, due now, scheduled, in flight, dead, next due ms or -1,
--          next visibility deadline ms or -1}.
-- include lib/now.lua
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local flight = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {
  now,
  redis.call('ZCOUNT', KEYS[1], '-inf', now),
  redis.call('ZCARD', KEYS[1]),
  redis.call('ZCARD', KEYS[2]),
  redis.call('ZCARD', KEYS[3]),
  head[2] and tonumber(head[2]) or -1,
  flight[2] and tonumber(flight[2]) or -1,
}
