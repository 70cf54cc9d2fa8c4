-- Grant a lock, or re-grant it to the token that already holds it.
--
-- KEYS[1] lock key: the holder's record while held, a tombstone for a while after a
--         release (the fence counter and the released tokens); see lib/lock_record.lua
-- KEYS[2] fencing counter: read only when the lock key is gone (a name's first use or
--         a lease that ran out); written for a fence ahead of the Redis clock, with
--         each index entry (a floor: see listed() below), and by RedLock's fence rule
--         (ARGV[7] 'counter') on every grant
-- KEYS[3] held-locks index (zset lock key -> until when the name is listed, ms; one
--         per hash slot on a cluster): a name is added again only when its entry
--         would end before the new lease, for two leases, so a lock taken and given
--         back over and over writes it about once a lease; the key expires with its
--         last entry
-- KEYS[4] tokens given back (lock_release.lua's 'abandon'; a zset, entry -> until when
--         it is kept, ms), read while the lock key's released list is marked to (see
--         lib/lock_record.lua) or the key is gone; a key made from nothing then carries
--         the mark on (until KEYS[4] expires)
-- ARGV[1] token          ARGV[2] lease in ms
-- ARGV[3] how many times this token already holds the lock (0 = fresh)
-- ARGV[4] "1" when the caller waited before this try, else "0"
-- ARGV[5] the holder's description (thread \n host \n pid \n watchdog \n caller)
-- ARGV[6] fencing counter retention in ms (FENCE_RETENTION): how long the counter
--         outlives the moment the Redis clock passes the last fence
-- ARGV[7] (optional) fence rule: 'clock' (default) or 'counter' (RedLock: see below)
--
-- Returns {1, fence, count, state} when granted (state: what lock_release.lua takes as
-- ARGV[7]; left out for a fence ahead of the clock). A token that already holds the lock
-- is granted again (count = ARGV[3] + 1), so a retried call whose reply was lost
-- gets the same answer instead of stranding the lock.
-- Returns {0, pttl} when another token holds it: pttl is the holder's remaining
-- lease in ms (-1 when the key has no expiry), the longest a waiter must wait.
-- A refusal marks the holder's record 'waiting', so that its release wakes one. A
-- grant to a caller that waited is marked too: others may still be waiting, and its
-- own release must wake the next of them.
-- Returns {2} for a re-entry (ARGV[3] > 0) whose token no longer holds the lock
-- (its lease ran out, or it was force-released): nothing is granted.
-- Returns {3} for a token already released or given up (a late copy of a try
-- whose caller gave the lock back): nothing is granted.
--
-- A fresh grant's fence is max(last fence + 1, Redis clock in microseconds):
-- fences rise across a restart that lost the counter and across a restore from
-- an older snapshot (whose counter is behind), so the counter may expire. The last
-- fence is the record's (then the tombstone's) 'last' field; only a fence ahead of
-- the clock (the clock stepped back) is also written to KEYS[2] (never below the floor
-- already there for the index entry: fenced()), until the clock has passed it plus
-- ARGV[6] ms, so that it outlives a lease that runs out.
-- With ARGV[7] 'counter' it is the counter KEYS[2] + 1, and the clock only when the
-- counter is missing: RedLock's masters then agree on the fence of a grant, and
-- its client usually needs no second round trip to make them agree (lock_fence.lua
-- when they disagree; backends/redlock.py). That counter is written on every grant.
-- include lib/now.lua
local value = redis.call('GET', KEYS[1])
local lease = tonumber(ARGV[2])

-- Whether the released-token entry id is among the tokens given back (KEYS[4], written
-- by lock_release.lua's 'abandon').
local function given_back(id)
  return redis.call('ZSCORE', KEYS[4], id) ~= false
end

-- With no lock key: nil when the entry id was given back (refused), else the released
-- list of the key made now: the mark to read KEYS[4] until it expires, '' when it is gone.
local function carried(id)
  local left = redis.call('PTTL', KEYS[4])
  if left == -2 then
    return ''
  end
  if given_back(id) then
    return nil
  end
  return '@' .. string.format('%d', now + (left >= 0 and left or tonumber(ARGV[6])))
end

-- List the name in the held-locks index for two leases (returns until when), drop the
-- entries that ended, and keep the index key itself no longer than its last entry. With
-- a fence (clock rule), KEYS[2] keeps a floor as long: at least every fence granted
-- while the index entry lasts (each is the clock, before its end), so that a lease
-- that runs out without a release (KEYS[1] gone) leaves its fence behind, past the
-- moment the clock passes it by the retention (a Redis clock stepped back then still
-- gives a higher fence). Written once per entry, not per grant.
local function listed(fence, ms, retention)
  local until_ms = now + 2 * ms
  redis.call('ZADD', KEYS[3], until_ms, KEYS[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  redis.call('PEXPIREAT', KEYS[3], until_ms, 'NX')
  redis.call('PEXPIREAT', KEYS[3], until_ms, 'GT')
  if fence then
    local floor = math.max(fence, until_ms * 1000)
    redis.call('SET', KEYS[2], string.format('%d', floor), 'PX',
      math.ceil((floor - now_us) / 1000) + retention)
  end
  return until_ms
end
if value and ARGV[3] == '0' and string.byte(value, 1) ~= 10 and
    string.sub(value, 1, #ARGV[1] + 1) ~= ARGV[1] .. '\n' then
  -- The common refusal, written out: another token holds the lock and its record
  -- already says a try waits, so nothing is written; the lease left is the record's
  -- until less now. Fields (lib/lock_record.lua): the 11th newline ends 'last', then
  -- 'waiting', 'indexed', 'until'. Any other case goes on below.
  local at = 0
  for _ = 1, 11 do
    at = at and string.find(value, '\n', at + 1, true)
  end
  if at and string.sub(value, at + 1, at + 2) == '1\n' then
    local a = string.find(value, '\n', at + 3, true)
    local b = a and string.find(value, '\n', a + 1, true)
    local ends = b and tonumber(string.sub(value, a + 1, b - 1))
    if ends and ends > now then
      return {0, ends - now}
    end
  end
end
-- A fence ahead of the clock kept apart (KEYS[2]), never below the floor listed() wrote
-- for the index entry still running (until indexed ms): max(fence, indexed in us), until
-- the clock has passed it by the retention.
local function fenced(fence, indexed, ms, retention)
  local floor = math.max(fence, indexed * 1000)
  redis.call('SET', KEYS[2], string.format('%d', floor), 'PX',
    math.max(ms, math.ceil((floor - now_us) / 1000) + retention))
end
if ARGV[3] == '0' and ARGV[7] ~= 'counter' and (not value or string.byte(value, 1) == 10) then
  -- The common case, written out: a fresh try on the clock rule finds the lock free
  -- (no key, or a tombstone: see lib/lock_record.lua).
  -- (Plain finds and the tombstone's own digits: no pattern, no number formatted twice.)
  local last, indexed, released, listed_until = 0, 0, '', nil
  local id = string.sub(ARGV[1], 1, 16)  -- a released-token entry (ID, lib/lock_record.lua)
  if value then
    local a = string.find(value, '\n', 2, true)
    local b = a and string.find(value, '\n', a + 1, true)
    if a then
      last = tonumber(string.sub(value, 2, a - 1)) or 0
      listed_until = string.sub(value, a + 1, (b or #value + 1) - 1)
      indexed = tonumber(listed_until) or 0
      released = b and string.sub(value, b + 1) or ''
    end
    if released ~= '' and string.find(' ' .. released .. ' ', ' ' .. id .. ' ', 1, true) then
      return {3}
    end
    local mark = string.find(released, '@', 1, true)  -- give-backs kept apart, until
    if mark then  -- (lib/lock_record.lua)
      if (tonumber(string.sub(released, mark + 1)) or 0) > now then
        if given_back(id) then
          return {3}
        end
      else  -- passed: dropped
        released = string.sub(released, 1, math.max(0, mark - 2))
      end
    end
  else  -- no tombstone: a fence floor or counter may be left, and given-back tokens
    released = carried(id)  -- (the key now made reads them while they are kept)
    if not released then
      return {3}
    end
    last = tonumber(redis.call('GET', KEYS[2]) or '0')
  end
  local fence = now_us
  if last >= fence then
    fence = last + 1
    fenced(fence, indexed, lease, tonumber(ARGV[6]))
  end
  if indexed < now + lease then
    listed_until = string.format('%d', listed(math.max(last, fence), lease, tonumber(ARGV[6])))
  end
  local f = string.format('%d', fence)
  local rest = listed_until .. '\n' .. string.format('%d', now + lease) .. '\n' .. released
  redis.call('SET', KEYS[1],
    ARGV[1] .. '\n' .. f .. '\n1\n' .. ARGV[2] .. '\n' .. string.format('%d', now) .. '\n' ..
    ARGV[5] .. '\n' .. f .. (ARGV[4] == '1' and '\n1\n' or '\n0\n') .. rest, 'PX', lease)
  if fence > now_us then
    return {1, fence, 1}  -- (ahead of the clock: its release reads the record)
  end
  return {1, fence, 1, f .. '\n' .. rest}
end
-- include lib/lock_record.lua
local r = read(value)
if r and r.token ~= '' then
  if r.token ~= ARGV[1] then
    if ARGV[3] ~= '0' then
      return {2}
    end
    local pttl = redis.call('PTTL', KEYS[1])
    if r.waiting ~= '1' and r.holder then
      r.waiting = '1'
      redis.call('SET', KEYS[1], record(r), 'KEEPTTL')
    end
    return {0, pttl}
  end
  -- Held by this token: a re-entry, or a repeated try. Same fence, one hold more.
  if not r.holder then  -- a record without the holder's fields
    r.fence = r.fence or redis.call('GET', KEYS[2]) or '0'
    r.ttl, r.acquired_at, r.holder = ARGV[2], now, ARGV[5]
    r.last = math.max(r.last, tonumber(r.fence))
    -- A give-back beside such a value could not mark it, only KEYS[4]: the record made
    -- now reads that key while it lives (as carried() marks a key made from nothing).
    local left = redis.call('PTTL', KEYS[4])
    if left > 0 and not string.find(r.released, '@', 1, true) then
      r.released = (r.released == '' and '' or r.released .. ' ') ..
        '@' .. string.format('%d', now + left)
    end
  end
  r.count = tonumber(ARGV[3]) + 1
  if r.indexed < now + lease then
    r.indexed = listed(ARGV[7] ~= 'counter' and r.last or nil, lease, tonumber(ARGV[6]))
  end
  r.ends = now + lease
  redis.call('SET', KEYS[1], record(r), 'PX', lease)
  return {1, tonumber(r.fence), r.count, state(r)}
end
if ARGV[3] ~= '0' then
  return {2}
end
if r and remembered(r, string.sub(ARGV[1], 1, ID)) then
  return {3}
end
if r and marked(r.released, now) and given_back(string.sub(ARGV[1], 1, ID)) then
  return {3}
end
if not r then
  -- No key: the key made now reads the given-back tokens while they are kept.
  local released = carried(string.sub(ARGV[1], 1, ID))
  if not released then
    return {3}
  end
  r = {last = 0, indexed = 0, released = released}
end
-- Free: a fresh grant.
local margin = tonumber(ARGV[6])
local fence = now_us
if ARGV[7] == 'counter' then
  local last = redis.call('GET', KEYS[2])
  if last then
    fence = tonumber(last) + 1
  end
  local keep = math.max(lease, math.ceil((fence - now_us) / 1000) + margin)
  redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', keep)
else
  if r.token == nil then  -- no tombstone: a fence floor or counter may be left
    r.last = tonumber(redis.call('GET', KEYS[2]) or '0')
  end
  if r.last >= fence then
    fence = r.last + 1
    fenced(fence, r.indexed, lease, margin)
  end
end
r.token, r.fence, r.count, r.ttl, r.acquired_at, r.holder =
  ARGV[1], string.format('%d', fence), 1, ARGV[2], now, ARGV[5]
r.last = math.max(r.last, fence)
r.waiting = ARGV[4] == '1' and '1' or '0'
if r.indexed < now + lease then
  if ARGV[7] == 'counter' then  -- (the counter above is written on every grant)
    r.indexed = listed(nil, lease, margin)
  else
    r.indexed = listed(r.last, lease, margin)
  end
end
r.ends = now + lease
redis.call('SET', KEYS[1], record(r), 'PX', lease)
if fence > now_us then
  return {1, fence, 1}
end
return {1, fence, 1, state(r)}
