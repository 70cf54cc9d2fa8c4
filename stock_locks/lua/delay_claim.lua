-- Claim up to a batch of due items: move them in flight and return them.
--
-- KEYS[1] due zset   KEYS[2] items hash   KEYS[3] attempts hash   KEYS[4] errors hash
-- KEYS[5] in-flight zset   KEYS[6] dead zset
-- ARGV[1] batch size   ARGV[2] visibility timeout ms   ARGV[3] max deliveries
--
-- First, in-flight items whose visibility ran out (their drainer died or was too
-- slow) become due again, or go to the dead-letter set once they have had
-- their deliveries. Then the earliest due items move to the in-flight set,
-- scored by their visibility deadline, and their delivery count goes up. One
-- script, so two drainers never claim the same item while it is in flight.
-- Returns a flat list: id, item JSON, deliveries, id, item JSON, deliveries...
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local limit = tonumber(ARGV[1])
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(lapsed) do
  redis.call('ZREM', KEYS[5], id)
  if tonumber(redis.call('HGET', KEYS[3], id) or 0) >= tonumber(ARGV[3]) then
    if redis.call('HEXISTS', KEYS[4], id) == 0 then
      redis.call('HSET', KEYS[4], id, 'not acknowledged before its visibility timeout (drainer lost?)')
    end
    redis.call('ZADD', KEYS[6], now, id)
  else
    redis.call('ZADD', KEYS[1], now, id)
  end
end
local claimed = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local item = redis.call('HGET', KEYS[2], id)
  if item then
    local deliveries = redis.call('HINCRBY', KEYS[3], id, 1)
    redis.call('ZADD', KEYS[5], now + tonumber(ARGV[2]), id)
    claimed[#claimed + 1] = id
    claimed[#claimed + 1] = item
    claimed[#claimed + 1] = deliveries
  end
end
return claimed
