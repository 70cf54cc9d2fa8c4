-- The lock key's value, read and written the same way by every lock script, included
-- where the line "-- include lib/lock_record.lua" stands (stock_locks/scripts.py).
--
-- A held lock is the holder's record, one string of fields separated by newlines:
--   token, fence, count, ttl ms, acquired_at ms (Redis clock), thread, host, pid,
--   watchdog, caller (the holder's description, stock_locks/backends/redis/protocol.py),
--   then the name's own state, carried from grant to grant:
--   last      the highest fence granted (or proposed, RedLock) for the name
--   waiting   '1' when a refused try may be waiting (its release then wakes one)
--   indexed   until when (ms) the held-locks index lists the name
--   until     when the lease ends (ms, Redis clock): the key's expiry, written down
--             so that a release that overwrote another holder's record (lock_release.lua)
--             can put it back with its expiry
--   released  the tokens most recently released or given up, each by its first ID
--             characters ('!' .. that: force released), newest first, separated by
--             spaces (a token is 32 random hex digits, stock_locks/core/lock.py: its
--             first 16 are 64 random bits, and the list half as long to copy)
-- A free lock whose name was used lately is a tombstone: an empty token, then
--   last, indexed and released (the same meanings). It expires FENCE_RETENTION after
--   the Redis clock passed last.
-- A value written by something else (a bare token) reads as a record of that token
-- with no fence.
--
-- A give-back (lock_release.lua's 'abandon') also keeps its token apart (KEYS[4] of the
-- lock scripts, ':given_back', a zset of entries by until when, each a FENCE_RETENTION,
-- however many), and marks the released list with
-- '@' .. until when (ms) that key lives: one last word, not an entry, never trimmed
-- with them; while it runs, a fresh try also reads that key (given-back tokens are
-- refused a FENCE_RETENTION however many releases come after them).
-- Defines the local functions read(value) -> nil (no value) or a table with those
-- fields (numbers for last, indexed and ends (until), token '' for a tombstone), ID;
-- record(r) and tombstone(r), the values to write for such a table; state(r), what a
-- grant returns (see there); remembered(r, entry), whether
-- entry is among r.released; remember(r, entry, kept, mark), entry put first in
-- r.released, at most kept entries kept, marked with the later of mark and its own.
local ID = 16  -- the characters of a token a released-token entry keeps

local function read(value)
  if not value then
    return nil
  end
  if string.byte(value, 1) == 10 then  -- a tombstone
    local last, indexed, released = string.match(value, '^\n(%d*)\n(%d*)\n?(.*)$')
    return {token = '', last = tonumber(last) or 0, indexed = tonumber(indexed) or 0,
      released = released or '', waiting = '0'}
  end
  -- The newlines after the first ten fields (plain finds: no pattern over the record).
  local cuts, at = {}, 0
  for i = 1, 10 do
    at = string.find(value, '\n', at + 1, true)
    if not at then
      break
    end
    cuts[i] = at
  end
  local n = #cuts
  local function field(i)
    if i > n + 1 then
      return nil
    end
    return string.sub(value, i == 1 and 1 or cuts[i - 1] + 1, (cuts[i] or #value + 1) - 1)
  end
  local r = {token = field(1), fence = field(2), count = field(3), ttl = field(4),
    acquired_at = field(5), waiting = '0', indexed = 0, released = ''}
  if n >= 9 then
    if n == 10 then
      r.holder = string.sub(value, cuts[5] + 1, cuts[10] - 1)
      local last, waiting, indexed, ends, released =
        string.match(value, '^(%d*)\n(%d*)\n(%d*)\n(%d*)\n(.*)$', cuts[10] + 1)
      r.last, r.waiting = tonumber(last) or 0, waiting or '0'
      r.indexed, r.ends, r.released = tonumber(indexed) or 0, tonumber(ends), released or ''
    else  -- a record without the name's state (an older version's)
      r.holder = string.sub(value, cuts[5] + 1)
    end
  end
  r.last = math.max(r.last or 0, tonumber(r.fence) or 0)
  return r
end

local function record(r)
  return r.token .. '\n' .. r.fence .. '\n' .. r.count .. '\n' .. r.ttl .. '\n' ..
    r.acquired_at .. '\n' .. r.holder .. '\n' .. string.format('%d', r.last) .. '\n' ..
    r.waiting .. '\n' .. string.format('%d', r.indexed) .. '\n' ..
    string.format('%d', r.ends or 0) .. '\n' .. r.released
end

-- What a grant returns for its release to write the tombstone without reading the
-- record first (lock_release.lua's ARGV[7]): last \n indexed \n until \n released.
local function state(r)
  return string.format('%d', r.last) .. '\n' .. string.format('%d', r.indexed) .. '\n' ..
    string.format('%d', r.ends or 0) .. '\n' .. r.released
end

local function tombstone(r)
  return '\n' .. string.format('%d', r.last) .. '\n' .. string.format('%d', r.indexed) ..
    '\n' .. r.released
end

local function remembered(r, entry)
  return r.released ~= '' and
    string.find(' ' .. r.released .. ' ', ' ' .. entry .. ' ', 1, true) ~= nil
end

-- The released list without its mark, and the mark ('' without one).
local function unmarked(list)
  local at = string.find(list, '@', 1, true)
  if not at then
    return list, ''
  end
  return string.sub(list, 1, math.max(0, at - 2)), string.sub(list, at)
end

-- Whether the give-backs kept apart (':given_back') may still list tokens: the mark's
-- time not passed yet.
local function marked(list, now_ms)
  local at = string.find(list, '@', 1, true)
  return at ~= nil and (tonumber(string.sub(list, at + 1)) or 0) > now_ms
end

local function remember(r, entry, kept, mark)
  local released, old_mark = unmarked(r.released)
  -- The later mark: :given_back lives as long as its latest entry (never shortened), so
  -- a give-back under a shorter retention must not make fresh tries stop reading it.
  local function ms(m)
    return m and tonumber(string.sub(m, 2)) or 0
  end
  if not mark or ms(old_mark) > ms(mark) then
    mark = old_mark
  end
  local list = released == '' and entry or entry .. ' ' .. released
  local at, count = 0, 0
  while true do
    at = string.find(list, ' ', at + 1, true)
    if not at then
      break
    end
    count = count + 1
    if count >= kept then
      list = string.sub(list, 1, at - 1)
      break
    end
  end
  r.released = mark == '' and list or list .. ' ' .. mark
end
