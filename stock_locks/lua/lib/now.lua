-- The Redis server's clock, read once (TIME) where the line
-- "-- include lib/now.lua" stands (stock_locks/scripts.py): every script that
-- needs the time includes this, so all of them read it the same way.
-- Defines the locals
--   now     the time in ms since the epoch (whole; the unit of every lease, score
--           and deadline in these scripts)
--   now_us  the time in microseconds since the epoch (whole; exact while below
--           2^53, i.e. until the year 2255)
-- and nothing else (the TIME reply itself stays inside the do block).
-- Expects nothing of the including script.
local now, now_us
do
  local time = redis.call('TIME')
  now = time[1] * 1000 + math.floor(time[2] / 1000)
  now_us = time[1] * 1000000 + time[2]
end
