-- Claim up to a batch of due items: move them in flight and return them.
--
-- KEYS[1] due zset   KEYS[2] items hash   KEYS[3] attempts hash   KEYS[4] errors hash
-- KEYS[5] in-flight zset   KEYS[6] dead zset
-- ARGV[1] batch size   ARGV[2] visibility timeout ms   ARGV[3] max deliveries
--
-- First, in-flight items whose visibility ran out (their drainer died or was too
-- slow) become due again, or go to the dead-letter set once they have had
-- their deliveries. Then the earliest due items move to the in-flight set,
-- scored by their visibility deadline. One script, so two drainers never claim
-- the same item while it is in flight.
--
-- Deliveries are counted in the attempts hash from the second one on: an item
-- in flight without an entry is on its first delivery. Writing nothing on the
-- common path keeps the hash small (a large listpack hash makes every write
-- scan it), and commands take the whole batch at once (in chunks, for unpack).
-- Returns a flat list: id, item JSON, deliveries, id, item JSON, deliveries...,
-- then (when anything was claimed) the batch's visibility deadline in epoch ms (it
-- identifies this delivery, for giving unstarted items back: delay_release.lua)
-- and the due time of its earliest item, epoch ms (how late the batch is).
local CHUNK = 1000
local function each_chunk(list, fn)
  for i = 1, #list, CHUNK do
    fn(unpack(list, i, math.min(i + CHUNK - 1, #list)))
  end
end
local function hmget(key, ids)
  local out = {}
  each_chunk(ids, function(...)
    for _, v in ipairs(redis.call('HMGET', key, ...)) do
      out[#out + 1] = v
    end
  end)
  return out
end

-- include lib/now.lua
local limit = tonumber(ARGV[1])
local max_deliveries = tonumber(ARGV[3])

for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', KEYS[5], id)
  local deliveries = tonumber(redis.call('HGET', KEYS[3], id) or 1)
  redis.call('HSET', KEYS[3], id, deliveries)
  if deliveries >= max_deliveries then
    redis.call('HSETNX', KEYS[4], id, 'not acknowledged before its visibility timeout (drainer lost?)')
    redis.call('ZADD', KEYS[6], now, id)
  else
    redis.call('ZADD', KEYS[1], now, id)
  end
end

local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit)
if #ids == 0 then
  return {}
end
local oldest_due = redis.call('ZSCORE', KEYS[1], ids[1])
each_chunk(ids, function(...) redis.call('ZREM', KEYS[1], ...) end)
local bodies = hmget(KEYS[2], ids)
local counts = hmget(KEYS[3], ids)
local deadline = now + tonumber(ARGV[2])
local claimed, flight, recount = {}, {}, {}
for i, id in ipairs(ids) do
  if bodies[i] then  -- (an id without a body was cancelled meanwhile: dropped)
    local deliveries = (tonumber(counts[i]) or 0) + 1
    flight[#flight + 1] = deadline
    flight[#flight + 1] = id
    if deliveries > 1 then
      recount[#recount + 1] = id
      recount[#recount + 1] = deliveries
    end
    claimed[#claimed + 1] = id
    claimed[#claimed + 1] = bodies[i]
    claimed[#claimed + 1] = deliveries
  end
end
each_chunk(flight, function(...) redis.call('ZADD', KEYS[5], ...) end)
each_chunk(recount, function(...) redis.call('HSET', KEYS[3], ...) end)
if #claimed > 0 then
  claimed[#claimed + 1] = deadline
  claimed[#claimed + 1] = oldest_due
end
return claimed
