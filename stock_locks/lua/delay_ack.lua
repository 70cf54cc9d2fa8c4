-- Acknowledge handled items: forget them, if they are still in flight.
--
-- KEYS[1] in-flight zset   KEYS[2] items hash   KEYS[3] attempts hash   KEYS[4] errors hash
-- ARGV ids
--
-- An item rescheduled while it was being handled is no longer in flight: the
-- ack leaves the new schedule alone. Needs Redis >= 6.2 (ZMSCORE).
-- Returns how many items were acknowledged.
local CHUNK = 1000
local acked = 0
for i = 1, #ARGV, CHUNK do
  local part = {unpack(ARGV, i, math.min(i + CHUNK - 1, #ARGV))}
  local scores = redis.call('ZMSCORE', KEYS[1], unpack(part))
  local flying = {}
  for j, id in ipairs(part) do
    if scores[j] then
      flying[#flying + 1] = id
    end
  end
  if #flying > 0 then
    acked = acked + redis.call('ZREM', KEYS[1], unpack(flying))
    redis.call('HDEL', KEYS[2], unpack(flying))
    redis.call('HDEL', KEYS[3], unpack(flying))
    redis.call('HDEL', KEYS[4], unpack(flying))
  end
end
return acked
