-- Release a lock held by a token, and wake one waiter if any was refused.
--
-- KEYS[1] lock key (the holder's record, then a tombstone; see lib/lock_record.lua)
-- KEYS[2] wake-up signal list   KEYS[3] fencing counter (see lock_acquire.lua)
-- KEYS[4] tokens given back ('abandon' below): a zset, entry -> until when it is kept (ms)
-- ARGV[1] token
-- ARGV[2] count: how many times the token holds the lock (1 unless reentrant)
-- ARGV[3] how long the wake-up signal waits for a waiter, ms
-- ARGV[4] fencing counter retention (FENCE_RETENTION), ms: the tombstone left by a
--         release lives this long after the Redis clock passed the last fence
-- ARGV[5] how many released tokens are remembered
-- ARGV[7] (optional) the grant's state, as lock_acquire.lua returned it: the release
--         then writes the tombstone first and checks what it replaced (SET ... GET);
--         empty or absent: it reads the record first
-- ARGV[6] mode: 'release'; 'abandon' (after a failed or interrupted acquire:
--         also remember the token when it holds nothing, so that a late copy
--         of its acquire is refused); 'force' (an operator's release: it is
--         remembered as '!' .. token, so its holder's own release is not
--         taken for a repeat and learns it lost the lock, while a repeated
--         force release is); 'retract' (RedLock taking back a grant that did not
--         win a majority: released, not remembered, so its next try may reuse
--         the token; the tombstone keeps the tokens released before it)
--
-- Returns 1 when the lock was freed (or this call's release already happened:
-- a repeat whose first reply was lost), 2 when a reentrant hold was only
-- decremented (still held), 0 when the token does not hold it (nothing
-- changed). 3 (for 0) and 4 (for 1) say that the write-first release (ARGV[7]) replaced
-- a value without a lease end and put it back without an expiry (see below): it stays
-- until its writer or an operator (force_release) removes it.
--
-- The released tokens are remembered in the lock key itself (the tombstone, then the
-- next holder's record, which carries them on): a release repeated after another
-- holder took the lock still finds its token.
local value
local function wake()
  -- One element: a release wakes one waiter, whose own release wakes the next.
  redis.call('DEL', KEYS[2])
  redis.call('RPUSH', KEYS[2], 1)
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
local clobbered = false  -- the key holds this call's tombstone, not value (below)
if ARGV[6] == 'release' and ARGV[2] == '1' and ARGV[7] and ARGV[7] ~= '' then
  -- The common case, before the shared functions are defined (plain finds, no table):
  -- the grant's state came back (ARGV[7]: last \n indexed \n until \n released), so
  -- the tombstone is known before the record is read, and one SET ... GET writes it
  -- and reads what it replaced. That must be the record of this token as granted (any
  -- 'waiting'); else it is put back below.
  local state = ARGV[7]
  local a = string.find(state, '\n', 1, true)
  local b = a and string.find(state, '\n', a + 1, true)
  local c = b and string.find(state, '\n', b + 1, true)
  if c then
    local released = string.sub(state, c + 1)
    local list = string.sub(ARGV[1], 1, 16)  -- this token's entry (ID, lib/lock_record.lua)
    local n = tonumber(ARGV[5]) - 1
    if released ~= '' then
      -- The newest ARGV[5] - 1 entries before it: an entry is 16 or 17 characters (ID,
      -- '!' before a force release's), so the (n)th space is the first from 17 * n on.
      local cut = 1  -- (none of them kept: all cut, from the start)
      if n > 0 then
        cut = string.find(released, ' ', 17 * n, true)
        list = list .. ' ' .. (cut and string.sub(released, 1, cut - 1) or released)
      end
      local mark = cut and string.find(released, '@', cut, true)
      if mark then  -- the give-backs' mark (lib/lock_record.lua) is never trimmed
        list = list .. ' ' .. string.sub(released, mark)
      end
    end
    value = redis.call('SET', KEYS[1], '\n' .. string.sub(state, 1, b) .. list,
      'PX', ARGV[4], 'GET')
    clobbered = true
    if value and string.sub(value, 1, #ARGV[1] + 1) == ARGV[1] .. '\n' then
      local last, rest = string.sub(state, 1, a - 1), string.sub(state, a + 1)
      local tail = string.sub(value, -(#last + #rest + 4))
      if tail == '\n' .. last .. '\n0\n' .. rest then
        return 1
      end
      if tail == '\n' .. last .. '\n1\n' .. rest then
        wake()
        return 1
      end
      -- The record's last fence and released tokens must be the grant's; its index
      -- entry and lease end may have moved on (lock_extend.lua, a watchdog): the
      -- tombstone then keeps the grant's index end, which only lists it again sooner.
      local l, waiting, rel = string.match(value, '\n(%d*)\n([01])\n%d*\n%d*\n([^\n]*)$')
      if l == last and rel == released then
        if waiting == '1' then
          wake()
        end
        return 1
      end
    end
  end
end
-- include lib/lock_record.lua
local entry = string.sub(ARGV[1], 1, ID)
if ARGV[6] == 'force' then
  entry = '!' .. entry
end
local kept = tonumber(ARGV[5])
local retention = tonumber(ARGV[4])
if not clobbered then
  value = redis.call('GET', KEYS[1])
end
local r = read(value)
-- A give-back ('abandon'): the token is remembered at least a retention (its late try
-- may land that late): kept apart (KEYS[4]) that long, and in the key while it lives
-- (its record carries it on to the next tombstone), which is marked to read KEYS[4]
-- until then (see lib/lock_record.lua), however many releases trim its list meanwhile
-- or a lease runs out. KEYS[4] is a zset (entry -> until when it is kept, ms), bounded by
-- time, not count: the entries whose time passed are dropped on each write, and the key
-- expires with its latest entry. Returns the mark.
local function give_back()
  local time = redis.call('TIME')
  local now_ms = time[1] * 1000 + math.floor(time[2] / 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now_ms)
  redis.call('ZADD', KEYS[4], now_ms + retention, entry)
  redis.call('PEXPIRE', KEYS[4], retention, 'NX')  -- (never shortened: a retention
  redis.call('PEXPIRE', KEYS[4], retention, 'GT')  -- configured shorter meanwhile)
  return '@' .. string.format('%d', now_ms + retention)
end
local unexpiring = false  -- a value put back without an expiry (below)
if not r or r.token ~= ARGV[1] then
  if clobbered then  -- put back what the SET ... GET replaced
    if not r then
      redis.call('DEL', KEYS[1])
    elseif r.token ~= '' and r.ends and r.ends > 0 then
      redis.call('SET', KEYS[1], value, 'PXAT', r.ends)
    elseif r.token == '' then  -- a tombstone: kept as long as a release would keep it
      -- (never less than it had: a retention after the clock passed its last fence)
      local time = redis.call('TIME')
      local ahead = r.last - (time[1] * 1000000 + time[2])
      redis.call('SET', KEYS[1], value, 'PX', math.max(retention,
        math.ceil(ahead / 1000) + retention))
    else  -- a value without a lease end (another program's, an older version's record):
      -- its expiry must not be cut short (another token could then be granted while it
      -- holds), and it is unknown here: the SET ... GET above replaced it, and reading
      -- it first (PTTL) would cost every release a server command (the uncontended cycle
      -- 7, not 6) for a case no process of this version makes (its records carry their
      -- lease end; docs/operations.md: stop the old version's processes first); nor does
      -- the value tell it (an old record's ttl and acquired_at miss its extensions). So
      -- it is put back without one, and stays until its writer or an operator
      -- (force_release) removes it: kept too long rather than granted twice. The reply
      -- says so (3 or 4 below), for the caller to warn an operator.
      redis.call('SET', KEYS[1], value)
      unexpiring = true
    end
  end
  if r and remembered(r, entry) then
    return unexpiring and 4 or 1
  end
  if ARGV[6] == 'abandon' then
    local mark = give_back()
    if not r then  -- nothing there: a tombstone that remembers the token, marked to
      -- read those given back before it (KEYS[4]) while they are kept
      r = {last = tonumber(redis.call('GET', KEYS[3]) or '0'), indexed = 0, released = ''}
      remember(r, entry, kept, mark)
      redis.call('SET', KEYS[1], tombstone(r), 'PX', retention)
    elseif r.token == '' then  -- a tombstone (free): kept a retention more if need be
      remember(r, entry, kept, mark)
      redis.call('SET', KEYS[1], tombstone(r), 'PX',
        math.max(redis.call('PTTL', KEYS[1]), retention))
    elseif r.holder then  -- another holder's record, whose lease (the key's expiry) must
      -- not move (KEYS[4] is for when the lease runs out first)
      remember(r, entry, kept, mark)
      redis.call('SET', KEYS[1], record(r), 'KEEPTTL')
    end
  end
  return unexpiring and 3 or 0
end
local count = tonumber(ARGV[2])
if count > 1 then
  if r.holder then
    r.count = count - 1
    redis.call('SET', KEYS[1], record(r), 'KEEPTTL')
  end
  return 2
end
if ARGV[6] == 'retract' then
  -- Free again, the retracted token not remembered (its next try may reuse it), but
  -- the tokens released before are (a repeated release still finds its own). RedLock's
  -- fences are its counter's, KEYS[3].
  redis.call('SET', KEYS[1], tombstone(r), 'PX', retention)
  return 1
end
-- A give-back of this token's own grant (its acquire was granted, the reply lost, the
-- caller gave up) is kept apart too: the tombstone alone is gone with the next lease
-- that runs out without a release.
local mark = ARGV[6] == 'abandon' and give_back() or nil
if not r.holder then  -- a value without holder fields (a bare token): a give-back beside
  -- it could not mark it, only KEYS[4]; the tombstone reads that key while it lives (as
  -- lock_acquire.lua's carried() marks a key made from nothing). (Rare: a command more.)
  local left = redis.call('PTTL', KEYS[4])
  if left > 0 then
    local time = redis.call('TIME')
    mark = '@' .. string.format('%d', time[1] * 1000 + math.floor(time[2] / 1000) + left)
  end
end
remember(r, entry, kept, mark)
-- The tombstone keeps the last fence until the Redis clock has passed it, plus the
-- retention. A fence is the clock at its grant unless the clock stepped back: read
-- the clock only then.
local ttl = retention
local granted = tonumber(r.acquired_at)
if not granted or r.last >= (granted + 1) * 1000 then
-- include lib/now.lua
  ttl = math.max(retention, math.ceil((r.last - now_us) / 1000) + retention)
end
redis.call('SET', KEYS[1], tombstone(r), 'PX', ttl)
if r.waiting == '1' then
  wake()
end
return 1
