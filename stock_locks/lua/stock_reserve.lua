-- Reserve every line of a cart, or none, within the customer's purchase caps.
--
-- KEYS[1] the order's reservation record (hash sku -> qty)
-- KEYS[2] index of open reservation records (zset: order ref -> created ms)
-- KEYS[3] the "loaded" marker: missing when Redis lost its data since the counters
--         were built from the database
-- KEYS[4] move versions (hash sku -> version, bumped on every move of its counter)
-- KEYS[5], KEYS[6] the group commit's queue and leader (see lib/confirm_join.lua)
-- KEYS[7..n+6] the available-stock counter of each line
-- KEYS[n+7..n+m+6] the customer's usage under each cap the cart touches (hash
--         order ref -> "units:ms"; stock_locks/stock/caps.py)
-- ARGV[1] order ref    ARGV[2] m, the number of caps
-- ARGV[3..n+2] quantity of each line     ARGV[n+3..2n+2] SKU of each line
-- ARGV[2n+3..2n+4m+2] per cap: max, since ms (0: none), period ms (0: none), the
--         cart's units under it
-- ARGV[2n+4m+3..2n+4m+6] (optional) the group commit's job, token, lease ms and
--         wait ms: a reservation made here joins it at once
-- Derived (the same hash tag, so the same slot): KEYS[1] .. ':caps', hash usage key
-- -> units, so that a release finds the usage entries to remove.
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
--         {5, j, used}      cap j would pass its max: the customer holds used units
--                           under it in its window; nothing moved
-- (now_ms is the Redis clock, for the reservation's due time.)
-- include lib/confirm_join.lua
if redis.call('EXISTS', KEYS[3]) == 0 then
  return {4}
end
-- include lib/now.lua
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {2, now}
end
local m = tonumber(ARGV[2])
local n = #KEYS - 6 - m
local missing = {3}
for i = 1, n do
  local avail = redis.call('GET', KEYS[i + 6])
  if not avail then
    missing[#missing + 1] = i
  elseif #missing == 1 and tonumber(avail) < tonumber(ARGV[i + 2]) then
    return {0, i, tonumber(avail), tonumber(redis.call('HGET', KEYS[4], ARGV[n + i + 2]) or '0')}
  end
end
if #missing > 1 then
  return missing
end
for j = 1, m do
  local at = 2 * n + 4 * j - 1
  local start = tonumber(ARGV[at + 1])
  local period = tonumber(ARGV[at + 2])
  if period > 0 and now - period > start then
    start = now - period
  end
  local used, gone = 0, {}
  local entries = redis.call('HGETALL', KEYS[n + 6 + j])
  for e = 1, #entries, 2 do
    local units, made = string.match(entries[e + 1], '^(%d+):(%d+)$')
    if tonumber(made) >= start then
      used = used + tonumber(units)
    else
      gone[#gone + 1] = entries[e]  -- out of the window for good (time only moves on)
    end
  end
  if #gone > 0 then
    redis.call('HDEL', KEYS[n + 6 + j], unpack(gone))
  end
  if used + tonumber(ARGV[at + 3]) > tonumber(ARGV[at]) then
    return {5, j, used}
  end
end
local record = {}
for i = 1, n do
  redis.call('DECRBY', KEYS[i + 6], ARGV[i + 2])
  record[#record + 1] = ARGV[n + i + 2]
  record[#record + 1] = ARGV[i + 2]
  redis.call('HINCRBY', KEYS[4], ARGV[n + i + 2], 1)
end
redis.call('HSET', KEYS[1], unpack(record))
redis.call('ZADD', KEYS[2], now, ARGV[1])
for j = 1, m do
  local units = ARGV[2 * n + 4 * j + 2]
  redis.call('HSET', KEYS[n + 6 + j], ARGV[1], units .. ':' .. now)
  redis.call('HSET', KEYS[1] .. ':caps', KEYS[n + 6 + j], units)
end
local job = ARGV[2 * n + 4 * m + 3]
if job then
  return {1, now, confirm_join(KEYS[5], KEYS[6], job, ARGV[2 * n + 4 * m + 4],
                               ARGV[2 * n + 4 * m + 5], ARGV[2 * n + 4 * m + 6], now)}
end
return {1, now}
