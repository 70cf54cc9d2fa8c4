-- Grant a lock, or re-grant it to the token that already holds it.
--
-- KEYS[1] lock key: one string, the holder's record, expiring with the lease:
--         token \n fence \n count \n ttl ms \n acquired_at ms \n ARGV[5]
--         (ARGV[5]: thread \n host \n pid \n watchdog \n caller, from the client)
-- KEYS[2] fencing counter (the last fence granted; expires ARGV[6] ms after the
--         Redis clock passes it, and not before the lease ends)
-- KEYS[3] waiters flag (a string a refusal sets; the release's DEL of the lock
--         and this key counts it, so a release learns of waiters for free)
-- KEYS[4] held-locks index (zset lock key -> lease end, ms; one per hash slot on a cluster)
-- KEYS[5] released tokens (list, newest first; see lock_release.lua)
-- ARGV[1] token          ARGV[2] lease in ms
-- ARGV[3] how many times this token already holds the lock (0 = fresh)
-- ARGV[4] "1" when the caller waited before this try, else "0"
-- ARGV[5] the holder's description (see KEYS[1]; no newline but between fields)
-- ARGV[6] fencing counter retention in ms (FENCE_RETENTION): how long the counter
--         outlives the moment the Redis clock passes the last fence
-- ARGV[7] (optional) fence rule: 'clock' (default) or 'counter' (RedLock: see below)
--
-- Returns {1, fence, count} when granted. A token that already holds the lock
-- is granted again (count = ARGV[3] + 1), so a retried call whose reply was lost
-- gets the same answer instead of stranding the lock.
-- Returns {0, pttl} when another token holds it: pttl is the holder's remaining
-- lease in ms (-1 when the key has no expiry), the longest a waiter must wait.
-- A refusal sets the waiters flag (for the holder's lease), so that its release
-- wakes one. A grant to a caller that waited sets it too: others may still be
-- waiting, and its own release must wake the next of them.
-- Returns {2} for a re-entry (ARGV[3] > 0) whose token no longer holds the lock
-- (its lease ran out, or it was force-released): nothing is granted.
-- Returns {3} for a token already released or given up (a late copy of a try
-- whose caller gave the lock back): nothing is granted.
--
-- A fresh grant's fence is max(last fence + 1, Redis clock in microseconds):
-- fences rise across a restart that lost the counter and across a restore from
-- an older snapshot (whose counter is behind), so the counter may expire. It is
-- needed only until the clock has passed the last fence: then the clock alone
-- gives more. So it expires ARGV[6] ms after that (the margin for the clock
-- stepping back), never before the lease ends: (fence - now_us) / 1000 + ARGV[6]
-- ms from now, usually just ARGV[6] (the fence is the clock).
-- With ARGV[7] 'counter' it is last fence + 1, and the clock only when the
-- counter is missing: RedLock's masters then agree on the fence of a grant, and
-- its client usually needs no second round trip to make them agree (lock_fence.lua
-- when they disagree; backends/redlock.py).
-- include lib/now.lua
if ARGV[3] == '0' and redis.call('LPOS', KEYS[5], ARGV[1]) then
  return {3}
end
local record = redis.call('GET', KEYS[1])
if not record then
  if ARGV[3] ~= '0' then
    return {2}
  end
  -- Free: a fresh grant. The fence comes first, so that the grant is one SET of the
  -- whole record (a refused try never touches the counter).
  local fence = string.format('%d', now_us)
  local lease, margin = tonumber(ARGV[2]), tonumber(ARGV[6])
  local keep = math.max(lease, margin)  -- the counter's expiry (ms) when fence = now_us
  if ARGV[7] == 'counter' then
    local last = redis.call('GET', KEYS[2])
    if last then
      fence = string.format('%d', tonumber(last) + 1)
      keep = math.max(lease, math.ceil((tonumber(fence) - now_us) / 1000) + margin)
    end
    redis.call('SET', KEYS[2], fence, 'PX', keep)
  else
    -- The clock is almost always ahead: write it, and look at what was there.
    local last = redis.call('SET', KEYS[2], fence, 'PX', keep, 'GET')
    if last and tonumber(last) >= tonumber(fence) then
      fence = string.format('%d', tonumber(last) + 1)
      keep = math.max(lease, math.ceil((tonumber(fence) - now_us) / 1000) + margin)
      redis.call('SET', KEYS[2], fence, 'PX', keep)
    end
  end
  redis.call('SET', KEYS[1],
    ARGV[1] .. '\n' .. fence .. '\n1\n' .. ARGV[2] .. '\n' .. now .. '\n' .. ARGV[5],
    'PX', ARGV[2])
  if ARGV[4] == '1' then
    redis.call('SET', KEYS[3], 1, 'PX', ARGV[2])
  end
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), KEYS[1])
  if now_us % 64 == 0 then  -- (as TIME's microsecond field % 64: 64 divides 10^6)
    -- Now and then, drop the entries of leases that ended without a release.
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  end
  return {1, tonumber(fence), 1}
end
local cut = string.find(record, '\n', 1, true)
if (cut and string.sub(record, 1, cut - 1) or record) == ARGV[1] then
  -- Held by this token: a re-entry, or a repeated try. Same fence, one hold more.
  local fence, _, rest = string.match(record, '^[^\n]*\n([^\n]*)\n([^\n]*)\n(.*)$')
  if not fence then  -- a record without the holder's fields
    fence = redis.call('GET', KEYS[2]) or '0'
    rest = ARGV[2] .. '\n' .. now .. '\n' .. ARGV[5]
  end
  local count = tonumber(ARGV[3]) + 1
  redis.call('SET', KEYS[1], ARGV[1] .. '\n' .. fence .. '\n' .. count .. '\n' .. rest,
    'PX', ARGV[2])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), KEYS[1])
  return {1, tonumber(fence), count}
end
if ARGV[3] ~= '0' then
  return {2}
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl > 0 then
  redis.call('SET', KEYS[3], 1, 'PX', pttl)
elseif pttl == -1 then
  redis.call('SET', KEYS[3], 1)
end
return {0, pttl}
