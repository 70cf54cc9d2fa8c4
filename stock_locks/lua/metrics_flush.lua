-- Add one process's figures to the timeline, and say that the process lives.
--
-- KEYS[1] the timeline's base name. Derived from it (the same hash tag, so the
--         same cluster slot: derived, not declared):
--           KEYS[1] .. ':' .. s        the bucket of second s
--           KEYS[1] .. ':10s:' .. t    the bucket of the ten seconds from t * 10
--           KEYS[1] .. ':processes'    hash "role|host|pid" -> last seen (ms)
-- ARGV[1] seconds a one-second bucket is kept   ARGV[2] the same for ten seconds
-- ARGV[3] n, then ARGV[4 .. 3 + n] the heartbeat fields this process writes
-- then pairs: field, amount to add
--
-- The time is the Redis server's (TIME), so every process's figures fall in
-- the same buckets, and its heartbeat is comparable with every other's,
-- whatever their hosts' clocks say. Returns that second.
-- include lib/now.lua
local second = math.floor(now / 1000)
local bucket = KEYS[1] .. ':' .. second
local coarse = KEYS[1] .. ':10s:' .. math.floor(second / 10)
local beats = tonumber(ARGV[3])
for i = 4, 3 + beats do
  redis.call('HSET', KEYS[1] .. ':processes', ARGV[i], now)
end
local first = 4 + beats
if first < #ARGV then
  for i = first, #ARGV - 1, 2 do
    redis.call('HINCRBY', bucket, ARGV[i], ARGV[i + 1])
    redis.call('HINCRBY', coarse, ARGV[i], ARGV[i + 1])
  end
  redis.call('EXPIRE', bucket, ARGV[1])
  redis.call('EXPIRE', coarse, ARGV[2])
end
return second
