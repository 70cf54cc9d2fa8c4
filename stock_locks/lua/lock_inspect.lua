#!lua flags=no-writes
-- Read who holds a lock, atomically (nothing is written).
--
-- KEYS[1] lock key (the holder's record, or a tombstone; see lib/lock_record.lua)
--
-- Returns {} when the lock is free (no key, or a tombstone: an empty token); else
-- {record, pttl} where pttl is the lease left in ms (-1: no expiry).
local record = redis.call('GET', KEYS[1])
if not record or string.sub(record, 1, 1) == '\n' then
  return {}
end
return {record, redis.call('PTTL', KEYS[1])}
