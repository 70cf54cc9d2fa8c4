-- Remove one item wherever it is (due, in flight or dead): cancel or discard.
--
-- KEYS[1] due zset   KEYS[2] items hash   KEYS[3] attempts hash   KEYS[4] errors hash
-- KEYS[5] in-flight zset   KEYS[6] dead zset
-- ARGV[1] id
-- Returns 1 when the item existed, 0 otherwise.
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return redis.call('HDEL', KEYS[2], ARGV[1])
