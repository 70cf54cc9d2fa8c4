-- Reserve every line of a cart, or none.
--
-- KEYS[1] the order's reservation record (hash sku -> qty)
-- KEYS[2] index of open reservation records (zset: order ref -> created ms)
-- KEYS[3..n+2] the available-stock counter of each line
-- ARGV[1] order ref
-- ARGV[2..n+1] quantity of each line     ARGV[n+2..2n+1] SKU of each line
--
-- Returns {1}            reserved: counters decremented, record written
--         {2}            this order ref already holds a reservation: nothing moved
--         {0, i, avail}  line i (1-based) asks more than avail: nothing moved
--         {3, i, ...}    the counters of lines i, ... are not loaded: nothing moved
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {2}
end
local n = #KEYS - 2
local missing = {3}
for i = 1, n do
  local avail = redis.call('GET', KEYS[i + 2])
  if not avail then
    missing[#missing + 1] = i
  elseif #missing == 1 and tonumber(avail) < tonumber(ARGV[i + 1]) then
    return {0, i, tonumber(avail)}
  end
end
if #missing > 1 then
  return missing
end
local record = {}
for i = 1, n do
  redis.call('DECRBY', KEYS[i + 2], ARGV[i + 1])
  record[#record + 1] = ARGV[n + i + 1]
  record[#record + 1] = ARGV[i + 1]
end
redis.call('HSET', KEYS[1], unpack(record))
local now = redis.call('TIME')
redis.call('ZADD', KEYS[2], now[1] * 1000 + math.floor(now[2] / 1000), ARGV[1])
return {1}
