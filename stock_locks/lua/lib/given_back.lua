-- Shared by sem_release.lua and fair_release.lua, included where the line
-- "-- include lib/given_back.lua" stands in them (stock_locks/scripts.py).
--
-- The memory of given-back ids (the gone zset: id -> until when it counts as
-- given back, ms), so that a repeated release (redis-py retrying a call whose
-- reply was lost) reports success again, and a late copy of an abandoned acquire
-- is refused (sem_acquire.lua and fair_acquire.lua look the id up there).
-- Expects the locals now (ms, lib/now.lua), id (the holder id), gone (the zset's
-- key, or nil: nothing is remembered), memory (how long a given-back id is
-- remembered, ms) and abandon (true after an acquire that failed or was
-- interrupted: the id is remembered whatever it held).
-- Defines the local function remember() (remember id from now for memory ms) and
-- the local repeated (true when id was remembered already: this call repeats a
-- release that gave a live permit back). Where it stands it forgets the ids
-- whose time has passed, sets repeated, then remembers id if abandon is true.
local function remember()
  if not gone then
    return
  end
  redis.call('ZADD', gone, now + memory, id)
  if redis.call('PTTL', gone) < memory then
    redis.call('PEXPIRE', gone, memory)
  end
end

local repeated = false
if gone then
  redis.call('ZREMRANGEBYSCORE', gone, '-inf', now)
  repeated = redis.call('ZSCORE', gone, id) ~= false
end
if abandon then
  remember()
end
