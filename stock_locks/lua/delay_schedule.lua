-- Schedule (or reschedule) one item of a delay queue.
--
-- KEYS[1] due zset   KEYS[2] items hash   KEYS[3] attempts hash   KEYS[4] errors hash
-- KEYS[5] in-flight zset   KEYS[6] dead zset   KEYS[7] signal list
-- ARGV[1] item id   ARGV[2] item JSON {"task", "payload"}
-- ARGV[3] delay in ms from now (Redis clock), used when ARGV[4] is ""
-- ARGV[4] absolute due time in epoch ms, or ""
--
-- The id is the item's identity: scheduling it again replaces its payload and
-- due time (and takes it out of flight or the dead-letter set), never adds a
-- second copy. When the item becomes the earliest due, the signal list gets
-- one element so that a blocked runner recomputes its wake-up time.
-- Returns the due time in epoch ms.
-- include lib/now.lua
local due = now + tonumber(ARGV[3])
if ARGV[4] ~= '' then
  due = tonumber(ARGV[4])
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('ZADD', KEYS[1], due, ARGV[1])
if #head == 0 or due < tonumber(head[2]) then
  redis.call('DEL', KEYS[7])
  redis.call('RPUSH', KEYS[7], due)
  redis.call('PEXPIRE', KEYS[7], 60000)
end
return due
