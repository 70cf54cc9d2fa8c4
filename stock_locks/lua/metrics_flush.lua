-- Add one process's figures to the current second's bucket of the timeline.
--
-- KEYS[1] the timeline's base name; the bucket of second s is KEYS[1] .. ':' .. s
--         (the same hash tag, so the same cluster slot: derived, not declared)
-- ARGV[1] seconds a bucket is kept   ARGV[2k], ARGV[2k+1] field, amount to add
--
-- The second is the Redis server's (TIME), so every process's figures fall in
-- the same buckets whatever their hosts' clocks say. Returns that second.
-- include lib/now.lua
local second = math.floor(now / 1000)
local bucket = KEYS[1] .. ':' .. second
for i = 2, #ARGV - 1, 2 do
  redis.call('HINCRBY', bucket, ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', bucket, ARGV[1])
return second
