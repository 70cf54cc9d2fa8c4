-- Reset the lease of a lock held by a token; a watchdog renewal may be capped.
--
-- KEYS[1] lock key (the holder's record; see lib/lock_record.lua)
-- KEYS[2] held-locks index (zset lock key -> until when the name is listed, ms)
-- ARGV[1] token      ARGV[2] new lease in ms, counted from now
-- ARGV[3] (optional) max_hold in ms, "0" or absent for none: the lease never
--         reaches past the grant's acquired_at (holder's record, Redis clock) plus this
--
-- Returns 1 when extended by the whole lease, 0 when the token does not hold
-- the lock (nothing changed), 2 when max_hold cut the lease: it now ends at the
-- cap (the last renewal), or the cap has passed and nothing was extended.
-- include lib/lock_record.lua
local r = read(redis.call('GET', KEYS[1]))
if not r or r.token ~= ARGV[1] then
  return 0
end
-- include lib/now.lua
local lease = tonumber(ARGV[2])
local result = 1
if ARGV[3] and ARGV[3] ~= '0' then
  local granted = tonumber(r.acquired_at)
  if granted then
    local left = granted + tonumber(ARGV[3]) - now
    if left <= 0 then
      return 2
    end
    if left <= lease then
      lease = left
      result = 2
    end
  end
end
if r.holder then
  if r.indexed < now + lease then
    -- The index lists the name past the new lease end (for two leases).
    r.indexed = now + 2 * lease
    redis.call('ZADD', KEYS[2], r.indexed, KEYS[1])
  end
  r.ends = now + lease
  redis.call('SET', KEYS[1], record(r), 'PX', lease)
else
  redis.call('PEXPIRE', KEYS[1], lease)
end
return result
