-- Raise a lock name's fencing counter to at least a grant's fence (RedLock).
--
-- KEYS[1] fencing counter   KEYS[2] lock key (the holder's record; see lib/lock_record.lua)
-- ARGV[1] token of the grant   ARGV[2] its fence   ARGV[3] counter retention, ms
-- ARGV[4] the lease, ms
--
-- A RedLock grant's fence is the highest its granting masters proposed; once a
-- majority stores at least that value, every later grant (whose majority meets
-- this one in at least one master) proposes more. The holder's record takes the
-- fence too, so a re-entry or an inspect on this master reports the grant's.
-- The counter expires ARGV[3] ms after this master's clock passes the fence, not
-- before the lease ends (lock_acquire.lua): a fence proposed by a master whose
-- clock runs ahead is kept here until this clock has caught up with it.
-- Returns 1 when the counter now holds at least ARGV[2]. Safe to repeat.
-- include lib/now.lua
-- include lib/lock_record.lua
local fence = tonumber(ARGV[2])
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if last < fence then
  local keep = math.max(tonumber(ARGV[4]), math.ceil((fence - now_us) / 1000) + tonumber(ARGV[3]))
  redis.call('SET', KEYS[1], ARGV[2], 'PX', keep)
end
local r = read(redis.call('GET', KEYS[2]))
if r and r.token == ARGV[1] and r.holder then
  r.fence = ARGV[2]
  r.last = math.max(r.last, fence)
  redis.call('SET', KEYS[2], record(r), 'KEEPTTL')
end
return 1
