-- Reset the lease of a lock held by a token; a watchdog renewal may be capped.
--
-- KEYS[1] lock key (the holder's record; see lock_acquire.lua)
-- KEYS[2] waiters flag (it lives as long as the lease)
-- KEYS[3] held-locks index (zset lock key -> lease end)
-- ARGV[1] token      ARGV[2] new lease in ms, counted from now
-- ARGV[3] (optional) max_hold in ms, "0" or absent for none: the lease never
--         reaches past the grant's acquired_at (holder's record, Redis clock) plus this
--
-- Returns 1 when extended by the whole lease, 0 when the token does not hold
-- the lock (nothing changed), 2 when max_hold cut the lease: it now ends at the
-- cap (the last renewal), or the cap has passed and nothing was extended.
local record = redis.call('GET', KEYS[1])
local cut = record and string.find(record, '\n', 1, true)
if not record or (cut and string.sub(record, 1, cut - 1) or record) ~= ARGV[1] then
  return 0
end
-- include lib/now.lua
local lease = tonumber(ARGV[2])
local result = 1
if ARGV[3] and ARGV[3] ~= '0' then
  local granted = tonumber(string.match(record, '^[^\n]*\n[^\n]*\n[^\n]*\n[^\n]*\n([^\n]*)'))
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
redis.call('PEXPIRE', KEYS[1], lease)
redis.call('PEXPIRE', KEYS[2], lease)
redis.call('ZADD', KEYS[3], now + lease, KEYS[1])
return result
