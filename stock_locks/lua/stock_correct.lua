-- Correct counters by measured amounts, each only if it did not move since the measure.
--
-- KEYS[1] move versions (hash sku -> version; also the channel where units coming
--         back are announced, as in stock_release.lua)   KEYS[2..n+1] the counters to correct
-- ARGV[3i-2] SKU of counter i   ARGV[3i-1] its version when measured ("" to add
--           whatever the version: a known relative change, such as a restock)
-- ARGV[3i] how much to add to it (negative to take away)
--
-- Returns, per counter, 1 when corrected and 0 when it moved since the measure
-- or is not loaded (nothing changed for it: measure again; loading reads the
-- database). Relative: it cannot undo a move made after the measurement.
-- A known relative change ("" version) bumps the version even when the counter
-- is not loaded, so that a loader that read the database before it loads again.
-- A correction that adds units is announced (clients that saw the SKU short ask again).
local function moved(sku, delta)
  local version = redis.call('HINCRBY', KEYS[1], sku, 1)
  if tonumber(delta) > 0 then
    redis.call('PUBLISH', KEYS[1], version .. ' ' .. sku)
  end
end
local done = {}
for i = 2, #KEYS do
  local sku, seen, delta = ARGV[3 * i - 5], ARGV[3 * i - 4], ARGV[3 * i - 3]
  local now = redis.call('HGET', KEYS[1], sku) or '0'
  if (seen == '' or now == seen) and redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('INCRBY', KEYS[i], delta)
    moved(sku, delta)
    done[#done + 1] = 1
  else
    if seen == '' then
      moved(sku, delta)
    end
    done[#done + 1] = 0
  end
end
return done
