-- Note that a name is in use, and forget the names unused for too long.
--
-- KEYS[1] the registry (zset: name -> when last noted in use, ms, Redis clock)
-- ARGV[1] the name     ARGV[2] how long an unused name stays listed, ms
-- Returns the number of names forgotten.
-- include lib/now.lua
redis.call('ZADD', KEYS[1], now, ARGV[1])
return redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - tonumber(ARGV[2])))
