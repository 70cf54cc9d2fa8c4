-- Read who holds a lock, atomically (nothing is written).
--
-- KEYS[1] lock key   KEYS[2] holder hash
--
-- Returns {} when the lock is free; else {token, pttl, now_s, now_us, holder}
-- where pttl is the lease left in ms (-1: no expiry), now_s/now_us the Redis
-- clock (TIME) and holder the holder hash as a flat field/value list (empty
-- when it is missing).
local token = redis.call('GET', KEYS[1])
if not token then
  return {}
end
local now = redis.call('TIME')
return {token, redis.call('PTTL', KEYS[1]), now[1], now[2], redis.call('HGETALL', KEYS[2])}
