-- Reserve every line of a cart, or none.
--
-- KEYS[1] the order's reservation record (hash sku -> qty)
-- KEYS[2] index of open reservation records (zset: order ref -> created ms)
-- KEYS[3] the "loaded" marker: missing when Redis lost its data since the counters
--         were built from the database
-- KEYS[4] move versions (hash sku -> version, bumped on every move of its counter)
-- KEYS[5], KEYS[6] the group commit's queue and leader (see lib/confirm_join.lua)
-- KEYS[7..n+6] the available-stock counter of each line
-- ARGV[1] order ref
-- ARGV[2..n+1] quantity of each line     ARGV[n+2..2n+1] SKU of each line
-- ARGV[2n+2..2n+5] (optional) the group commit's job, token, lease ms and wait ms:
--         a reservation made here joins it at once
--
-- Returns {1, now_ms[, joined]}  reserved: counters decremented, record written;
--                           joined (with a job): 1 when the caller leads the
--                           group commit, else its queue entry
--         {2, now_ms}       this order ref already holds a record: nothing moved
--         {0, i, avail, v}  line i (1-based) asks more than avail: nothing moved;
--                           v is its SKU's move version (a client may answer the
--                           same refusal itself until a later version is announced)
--         {3, i, ...}       the counters of lines i, ... are not loaded: nothing moved
--         {4}               Redis lost its data (no marker): nothing moved
-- (now_ms is the Redis clock, for the reservation's due time.)
-- include lib/confirm_join.lua
if redis.call('EXISTS', KEYS[3]) == 0 then
  return {4}
end
-- include lib/now.lua
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {2, now}
end
local n = #KEYS - 6
local missing = {3}
for i = 1, n do
  local avail = redis.call('GET', KEYS[i + 6])
  if not avail then
    missing[#missing + 1] = i
  elseif #missing == 1 and tonumber(avail) < tonumber(ARGV[i + 1]) then
    return {0, i, tonumber(avail), tonumber(redis.call('HGET', KEYS[4], ARGV[n + i + 1]) or '0')}
  end
end
if #missing > 1 then
  return missing
end
local record = {}
for i = 1, n do
  redis.call('DECRBY', KEYS[i + 6], ARGV[i + 1])
  record[#record + 1] = ARGV[n + i + 1]
  record[#record + 1] = ARGV[i + 1]
  redis.call('HINCRBY', KEYS[4], ARGV[n + i + 1], 1)
end
redis.call('HSET', KEYS[1], unpack(record))
redis.call('ZADD', KEYS[2], now, ARGV[1])
local job = ARGV[2 * n + 2]
if job then
  return {1, now, confirm_join(KEYS[5], KEYS[6], job, ARGV[2 * n + 3], ARGV[2 * n + 4],
                               ARGV[2 * n + 5], now)}
end
return {1, now}
