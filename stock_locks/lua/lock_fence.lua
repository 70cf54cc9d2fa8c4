-- Raise a lock name's fencing counter to at least a grant's fence (RedLock).
--
-- KEYS[1] fencing counter   KEYS[2] lock key (the holder's record; see lock_acquire.lua)
-- ARGV[1] token of the grant   ARGV[2] its fence   ARGV[3] counter retention, ms
--
-- A RedLock grant's fence is the highest its granting masters proposed; once a
-- majority stores at least that value, every later grant (whose majority meets
-- this one in at least one master) proposes more. The holder's record takes the
-- fence too, so a re-entry or an inspect on this master reports the grant's.
-- Returns 1 when the counter now holds at least ARGV[2]. Safe to repeat.
local fence = tonumber(ARGV[2])
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if last < fence then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
local record = redis.call('GET', KEYS[2])
if record then
  local token, rest = string.match(record, '^([^\n]*)\n[^\n]*\n(.*)$')
  if token == ARGV[1] then
    redis.call('SET', KEYS[2], token .. '\n' .. ARGV[2] .. '\n' .. rest, 'KEEPTTL')
  end
end
return 1
