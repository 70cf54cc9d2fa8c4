-- Set an available-stock counter, but only if nobody changed it meanwhile.
--
-- KEYS[1] the counter
-- ARGV[1] the value read before ("" when the key was missing)   ARGV[2] new value
-- Returns 1 when set, 0 when the counter moved since it was read (try again).
local now = redis.call('GET', KEYS[1])
if (now or '') ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
