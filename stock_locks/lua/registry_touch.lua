-- Register a name in a registry: the semaphores or delay queues in use, listed by
-- the admin page without walking the keyspace (backends/redis/registry.py).
--
-- KEYS[1] registry (zset: name -> last use, ms on the Redis clock)
-- ARGV[1] name   ARGV[2] retention in ms: names unused for longer are dropped
--
-- Scores the name with the Redis clock, drops the names older than the retention
-- and lets the whole registry expire a retention after its last registration.
-- Returns how many names were dropped.
-- include lib/now.lua
redis.call('ZADD', KEYS[1], now, ARGV[1])
local oldest = string.format('%d', now - tonumber(ARGV[2]))
local dropped = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. oldest)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return dropped
