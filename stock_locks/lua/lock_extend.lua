-- Reset the lease of a lock held by a token; a watchdog renewal may be capped.
--
-- KEYS[1] lock key (the holder's record; see lib/lock_record.lua)
-- KEYS[2] held-locks index (zset lock key -> until when the name is listed, ms)
-- KEYS[3] fencing counter (a floor for the clock rule; see lock_acquire.lua)
-- ARGV[1] token      ARGV[2] new lease in ms, counted from now
-- ARGV[3] (optional) max_hold in ms, "0" or absent for none: the lease never
--         reaches past the grant's acquired_at (holder's record, Redis clock) plus this
-- ARGV[4] fence rule, 'clock' or 'counter' (RedLock: its counter is not a floor)
-- ARGV[5] fencing counter retention in ms (FENCE_RETENTION)
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
    -- The index lists the name past the new lease end (for two leases), and the fence
    -- floor (KEYS[3]; clock rule) covers the fences granted while the entry lasts, as
    -- lock_acquire.lua's listed() does.
    r.indexed = now + 2 * lease
    redis.call('ZADD', KEYS[2], r.indexed, KEYS[1])
    redis.call('PEXPIREAT', KEYS[2], r.indexed, 'GT')
    if ARGV[4] ~= 'counter' then
      local floor = math.max(tonumber(redis.call('GET', KEYS[3]) or '0'), r.last,
        r.indexed * 1000)
      local keep = math.max(math.ceil((floor - now_us) / 1000) + tonumber(ARGV[5]),
        redis.call('PTTL', KEYS[3]))
      redis.call('SET', KEYS[3], string.format('%d', floor), 'PX', keep)
    end
  end
  r.ends = now + lease
  redis.call('SET', KEYS[1], record(r), 'PX', lease)
else
  redis.call('PEXPIRE', KEYS[1], lease)
end
return result
