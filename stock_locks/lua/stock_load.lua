-- Create missing available-stock counters from database levels, unless the SKU's
-- stock moved since the caller read its version (then the level may be stale).
--
-- KEYS[1] move versions (hash sku -> version)   KEYS[2..n+1] the counters
-- ARGV[3i-2] SKU of counter i   ARGV[3i-1] its version, read before the level
-- ARGV[3i] the level read from the database
--
-- Returns, per counter: 1 set now, 0 it already existed (left alone), -1 the
-- version moved since it was read (nothing set: read again). A counter set now
-- bumps its version and is announced, as in stock_release.lua (a client that saw
-- the SKU short before Redis lost it asks again).
local done = {}
for i = 2, #KEYS do
  local sku, seen, level = ARGV[3 * i - 5], ARGV[3 * i - 4], ARGV[3 * i - 3]
  if redis.call('EXISTS', KEYS[i]) == 1 then
    done[#done + 1] = 0
  elseif (redis.call('HGET', KEYS[1], sku) or '0') ~= seen then
    done[#done + 1] = -1
  else
    redis.call('SET', KEYS[i], level)
    local version = redis.call('HINCRBY', KEYS[1], sku, 1)
    redis.call('PUBLISH', KEYS[1], version .. ' ' .. sku)
    done[#done + 1] = 1
  end
end
return done
