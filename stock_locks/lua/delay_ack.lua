-- Acknowledge handled items: forget them, if they are still in flight.
--
-- KEYS[1] in-flight zset   KEYS[2] items hash   KEYS[3] attempts hash   KEYS[4] errors hash
-- ARGV ids
--
-- An item rescheduled while it was being handled is no longer in flight: the
-- ack leaves the new schedule alone. Returns how many items were acknowledged.
local acked = 0
for _, id in ipairs(ARGV) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    acked = acked + 1
  end
end
return acked
