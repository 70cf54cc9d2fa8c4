-- A visitor's request at the waiting room: join (or find its place), one admission
-- step, then where it stands.
--
-- KEYS as in lib/waitingroom.lua (state, visitors, tickets, polled, active, the
-- lanes' lists, the lanes' pre-queue sets, the admission log), all under the event's
-- hash tag.
-- ARGV[1] visitor id     ARGV[2] its lane (1-based)     ARGV[3] 1: join when it has
--         no place; 0: only look
-- ARGV[4] pre-queue opens (ms)   ARGV[5] the sale starts (ms)   ARGV[6] max active
-- ARGV[7] admissions per minute  ARGV[8] stock factor   ARGV[9] units left (-1: no limit)
-- ARGV[10] queue_ttl (ms)  ARGV[11] session_ttl (ms)  ARGV[12] hold when this call makes the
--         state after the start (ms; 0 for none: see queue.py)
-- ARGV[13] most list entries one step takes
--
-- Returns {code, ticket, born, ahead, rate, until}, code:
--   0 UNKNOWN    no place (only with ARGV[3] = 0)
--   1 WAITING    ahead: places ahead (an upper bound: visitors dropped but not yet
--                reached count), rate: places taken off the heads per 1000 s (0: not
--                measured yet)
--   2 ADMITTED   (a poll counts as a request: its session is kept)
--   3 SOLD_OUT   waiting, and no unit is left: it keeps its place
--   4 PREQUEUE   joined before the start; until: ms to the start (its place is drawn then)
--   5 NOT_OPEN   the pre-queue is not open yet; until: ms to its opening
-- Running it twice with the same arguments (a lost reply) gives the same ticket.
-- include lib/now.lua
-- include lib/waitingroom.lua
local visitor, lane, join = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local opens, start = tonumber(ARGV[4]), tonumber(ARGV[5])
local remaining = tonumber(ARGV[9])
if now < opens then
  return {5, 0, 0, 0, 0, opens - now}
end
draw(start, tonumber(ARGV[12]))
local born = tonumber(redis.call('HGET', state, 'born'))

local ticket = redis.call('HGET', visitors, visitor)
if ticket and redis.call('HEXISTS', tickets, ticket) == 0 then
  ticket = nil
end
local admitted_at = ticket and redis.call('ZSCORE', active, ticket)
if admitted_at and tonumber(admitted_at) >= now - tonumber(ARGV[11]) then
  redis.call('ZADD', active, now, ticket)
  return {2, tonumber(ticket), born, 0, 0, 0}
end
if admitted_at then  -- silent past session_ttl, not swept yet: the slot is lost
  redis.call('ZREM', active, ticket)
  redis.call('HINCRBY', state, 'abandoned_admitted', 1)
  forget(ticket)
  ticket = nil
end
if ticket then
  local seen = redis.call('ZSCORE', polled, ticket)
  if not seen or tonumber(seen) < now - tonumber(ARGV[10]) then
    -- No poll for queue_ttl: the place is lost (its list entry is skipped at the head).
    if seen then
      redis.call('ZREM', polled, ticket)
      redis.call('HINCRBY', state, 'abandoned_waiting', 1)
    end
    forget(ticket)
    ticket = nil
  end
end
if not ticket then
  if not join then
    return {0, 0, born, 0, 0, 0}
  end
  ticket = tostring(redis.call('HINCRBY', state, 'seq', 1))
  redis.call('HSET', visitors, visitor, ticket)
  if now < start then
    redis.call('SADD', KEYS[lanes + 5 + lane], ticket)
    redis.call('HSET', tickets, ticket, lane .. ':0:' .. visitor)
  else
    local place = redis.call('HINCRBY', state, 'pushed' .. lane, 1)
    redis.call('RPUSH', KEYS[5 + lane], ticket)
    redis.call('HSET', tickets, ticket, lane .. ':' .. place .. ':' .. visitor)
  end
end
redis.call('ZADD', polled, now, ticket)

step(start, tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), remaining,
     tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[13]))
if redis.call('ZSCORE', active, ticket) then
  return {2, tonumber(ticket), born, 0, 0, 0}
end
if now < start then
  return {4, tonumber(ticket), born, 0, 0, start - now}
end
local own_lane, place = string.match(redis.call('HGET', tickets, ticket), '^(%d+):(%d+):')
local ahead, rate = position(tonumber(own_lane), tonumber(place))
if remaining == 0 then
  return {3, tonumber(ticket), born, ahead, rate, 0}
end
return {1, tonumber(ticket), born, ahead, rate, 0}
