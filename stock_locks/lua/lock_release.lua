-- Release a lock held by a token, and wake one waiter if any was refused.
--
-- KEYS[1] lock key (the holder's record: token \n fence \n count \n ...; see
--         lock_acquire.lua)
-- KEYS[2] waiters flag (set by a refused try)   KEYS[3] wake-up signal list
-- KEYS[4] released tokens (list, newest first: at least the ARGV[5] latest
--         tokens released, given up or force-released; expires ARGV[4] ms
--         after it was created)
-- KEYS[5] held-locks index (zset lock key -> lease end)
-- ARGV[1] token
-- ARGV[2] count: how many times the token holds the lock (1 unless reentrant)
-- ARGV[3] how long the wake-up signal waits for a waiter, ms
-- ARGV[4] how long the released-tokens list lives once created, ms (one lease)
-- ARGV[5] how many released tokens are remembered
-- ARGV[6] mode: 'release'; 'abandon' (after a failed or interrupted acquire:
--         also remember the token when it holds nothing, so that a late copy
--         of its acquire is refused); 'force' (an operator's release: it is
--         remembered as '!' .. token, so its holder's own release is not
--         taken for a repeat and learns it lost the lock, while a repeated
--         force release is); 'retract' (RedLock taking back a grant that did not
--         win a majority: released, not remembered, so its next try may reuse
--         the token)
--
-- Returns 1 when the lock was freed (or this call's release already happened:
-- a repeat whose first reply was lost), 2 when a reentrant hold was only
-- decremented (still held), 0 when the token does not hold it (nothing
-- changed).
local entry = ARGV[1]
if ARGV[6] == 'force' then
  entry = '!' .. ARGV[1]
end
local function remember()
  local length = redis.call('LPUSH', KEYS[4], entry)
  if length == 1 then
    redis.call('PEXPIRE', KEYS[4], ARGV[4])
  elseif length > 2 * tonumber(ARGV[5]) then
    redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[5]) - 1)  -- (once every ARGV[5] pushes)
  end
end
local record = redis.call('GET', KEYS[1])
local cut = record and string.find(record, '\n', 1, true)
if not record or (cut and string.sub(record, 1, cut - 1) or record) ~= ARGV[1] then
  if redis.call('LPOS', KEYS[4], entry) then
    return 1
  end
  if ARGV[6] == 'abandon' then
    remember()
  end
  return 0
end
local count = tonumber(ARGV[2])
if count > 1 then
  local fence, rest = string.match(record, '^[^\n]*\n([^\n]*)\n[^\n]*\n(.*)$')
  if fence then
    redis.call('SET', KEYS[1], ARGV[1] .. '\n' .. fence .. '\n' .. (count - 1) .. '\n' .. rest,
      'KEEPTTL')
  end
  return 2
end
-- One DEL of the lock and its waiters flag: 2 when a refused try set the flag.
local waiters = redis.call('DEL', KEYS[1], KEYS[2]) > 1
redis.call('ZREM', KEYS[5], KEYS[1])
if ARGV[6] ~= 'retract' then
  remember()
end
if waiters then
  -- One element: a release wakes one waiter, whose own release wakes the next.
  redis.call('DEL', KEYS[3])
  redis.call('RPUSH', KEYS[3], 1)
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
return 1
