#!lua flags=no-writes
-- Read who holds a lock, atomically (nothing is written).
--
-- KEYS[1] lock key (the holder's record; see lock_acquire.lua)
--
-- Returns {} when the lock is free; else {record, pttl} where pttl is the lease
-- left in ms (-1: no expiry).
local record = redis.call('GET', KEYS[1])
if not record then
  return {}
end
return {record, redis.call('PTTL', KEYS[1])}
