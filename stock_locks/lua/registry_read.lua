#!lua flags=no-writes
-- The names of a registry used within a retention, most recently used first.
--
-- KEYS[1] registry (zset: name -> last use, ms on the Redis clock)
-- ARGV[1] retention in ms   ARGV[2] at most this many names
--
-- Returns the names. Changes nothing (registry_touch.lua drops the old ones).
-- include lib/now.lua
local oldest = string.format('%d', now - tonumber(ARGV[1]))
return redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', oldest, 'LIMIT', 0, ARGV[2])
