-- Read who holds a lock, atomically (nothing is written).
--
-- KEYS[1] lock key (the holder's record; see lock_acquire.lua)
--
-- Returns {} when the lock is free; else {record, pttl, now_s, now_us} where
-- pttl is the lease left in ms (-1: no expiry) and now_s/now_us the Redis
-- clock (TIME).
local record = redis.call('GET', KEYS[1])
if not record then
  return {}
end
local now = redis.call('TIME')
return {record, redis.call('PTTL', KEYS[1]), now[1], now[2]}
