-- Put a reservation's units back, once.
--
-- KEYS[1] the order's reservation record (hash sku -> qty)
-- KEYS[2] index of open reservation records
-- KEYS[3] the "loaded" marker      KEYS[4] move versions (hash sku -> version;
--         its name is also the channel where units coming back are announced:
--         "<new version> <sku>", see stock_locks/stock/soldout.py)
-- KEYS[5..n+4] the available-stock counter of each line
-- ARGV[1] order ref     ARGV[2..n+1] SKU of each line (same order as the counters)
-- Derived (the same hash tag, so the same slot): KEYS[1] .. ':caps', the cap usage
-- hashes the reservation counts under (stock_reserve.lua): its entries go too.
--
-- Returns 1 when the units went back, 0 when there was no record (already
-- released or committed, or never reserved here): nothing moved; 4 when Redis
-- lost its data (no marker): nothing moved, the rebuild from the database
-- counts the units.
if redis.call('EXISTS', KEYS[3]) == 0 then
  return 4
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 1, #KEYS - 4 do
  local qty = redis.call('HGET', KEYS[1], ARGV[i + 1])
  if qty then
    if redis.call('EXISTS', KEYS[i + 4]) == 1 then
      redis.call('INCRBY', KEYS[i + 4], qty)
    end
    -- (a loader that read before reads again; a client that saw the SKU short asks again)
    local version = redis.call('HINCRBY', KEYS[4], ARGV[i + 1], 1)
    redis.call('PUBLISH', KEYS[4], version .. ' ' .. ARGV[i + 1])
  end
end
local caps = redis.call('HKEYS', KEYS[1] .. ':caps')
for _, usage in ipairs(caps) do
  redis.call('HDEL', usage, ARGV[1])
end
redis.call('DEL', KEYS[1], KEYS[1] .. ':caps')
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
