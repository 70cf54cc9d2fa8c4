-- Give claimed items that were not handled back to the queue, due now.
--
-- KEYS[1] due zset   KEYS[2] in-flight zset   KEYS[3] attempts hash   KEYS[4] signal list
-- ARGV triples: id, the visibility deadline (epoch ms) its claim returned, and
-- the delivery number it returned, ...
--
-- Only an item still in flight under that same claim (same deadline, same
-- delivery) goes back: one whose visibility ran out and that was claimed
-- again since, or that was acknowledged, cancelled or rescheduled, is left
-- alone, so a repeat (a lost reply) or a late call changes nothing. The
-- delivery is not counted: the item was never handed to a handler. A blocked
-- runner is woken. Returns how many items went back.
-- include lib/now.lua
local released = 0
for i = 1, #ARGV, 3 do
  local id = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[2], id)
  -- In flight, an entry counts deliveries from the second on (see delay_claim.lua).
  local deliveries = tonumber(redis.call('HGET', KEYS[3], id) or 1)
  if score and tonumber(score) == tonumber(ARGV[i + 1])
      and deliveries == tonumber(ARGV[i + 2]) then
    redis.call('ZREM', KEYS[2], id)
    -- Due, the entry counts deliveries made: one fewer now.
    if deliveries > 1 then
      redis.call('HSET', KEYS[3], id, deliveries - 1)
    else
      redis.call('HDEL', KEYS[3], id)
    end
    redis.call('ZADD', KEYS[1], now, id)
    released = released + 1
  end
end
if released > 0 then
  redis.call('DEL', KEYS[4])
  redis.call('RPUSH', KEYS[4], now)
  redis.call('PEXPIRE', KEYS[4], 60000)
end
return released
