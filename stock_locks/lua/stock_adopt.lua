-- Give an open database reservation its Redis record, taking its units from the
-- counters: for a reservation whose Redis half was lost (Redis lost its data
-- after the reserve script, before the database step committed).
--
-- KEYS[1] the order's reservation record   KEYS[2] index of open records
-- KEYS[3] the "loaded" marker   KEYS[4] move versions (hash sku -> version)
-- KEYS[5..n+4] the available-stock counter of each line
-- ARGV[1] order ref   ARGV[2] created ms
-- ARGV[3..n+2] quantity of each line   ARGV[n+3..2n+2] SKU of each line
--
-- Returns 1 when adopted; 0 when the record exists (nothing moved); 4 when
-- Redis lost its data (nothing moved). A counter that is not loaded is left
-- alone: loading it from the database counts the reservation already.
if redis.call('EXISTS', KEYS[3]) == 0 then
  return 4
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local n = #KEYS - 4
local record = {}
for i = 1, n do
  if redis.call('EXISTS', KEYS[i + 4]) == 1 then
    redis.call('DECRBY', KEYS[i + 4], ARGV[i + 2])
  end
  redis.call('HINCRBY', KEYS[4], ARGV[n + i + 2], 1)
  record[#record + 1] = ARGV[n + i + 2]
  record[#record + 1] = ARGV[i + 2]
end
redis.call('HSET', KEYS[1], unpack(record))
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
