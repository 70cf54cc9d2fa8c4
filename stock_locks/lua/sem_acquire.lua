-- Grant a permit of a semaphore, or say how long to wait for one.
--
-- KEYS[1] holders (zset: holder id -> when its lease ends, ms on the Redis clock)
-- KEYS[2] meta (hash: 'limit', 'waiting' and holder id -> JSON metadata)
-- KEYS[3] gone (zset: holder id -> until when it counts as given back, ms)
-- ARGV[1] holder id      ARGV[2] limit      ARGV[3] lease in ms
-- ARGV[4] the longest the caller will wait before trying again, ms
--         (0: it will not wait; -1: no bound of its own)
-- ARGV[5] host  ARGV[6] pid  ARGV[7] thread  ARGV[8] caller
--
-- Ended leases are removed first: a holder that died frees its permit when its
-- lease ends, with nobody having to notice.
-- Returns {2}, changing nothing, when the id was given back (see sem_release.lua):
-- this call is a late copy of a try whose caller has already moved on.
-- Returns {1} when granted: fewer than limit holders remained, or the id already
-- holds a permit (its lease is renewed), so a retried call whose reply was lost
-- gets the same answer.
-- Returns {0, wait} when refused: wait (ms) is when the lease that would free a
-- permit ends, the longest a waiter must sleep if no release wakes it, cut to
-- ARGV[4]. A caller that will wait marks 'waiting' until then, so that every
-- release meanwhile pushes a wake-up.
-- include lib/now.lua
local id, limit, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local patience = tonumber(ARGV[4])

if tonumber(redis.call('ZSCORE', KEYS[3], id) or 0) > now then
  return {2}
end

-- Every key lives until the last lease ends or the last waiter's mark passes,
-- so an abandoned semaphore vanishes by itself.
local function keep()
  local last = tonumber(redis.call('HGET', KEYS[2], 'waiting') or 0)
  local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if top[2] and tonumber(top[2]) > last then
    last = tonumber(top[2])
  end
  if last > now then
    redis.call('PEXPIRE', KEYS[1], last - now)
    redis.call('PEXPIRE', KEYS[2], last - now)
  else
    redis.call('DEL', KEYS[1], KEYS[2])
  end
end

for _, ended in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('ZREM', KEYS[1], ended)
  redis.call('HDEL', KEYS[2], ended)
end

if redis.call('ZSCORE', KEYS[1], id) then
  redis.call('ZADD', KEYS[1], now + lease, id)
  keep()
  return {1}
end
local held = redis.call('ZCARD', KEYS[1])
if held < limit then
  redis.call('ZADD', KEYS[1], now + lease, id)
  redis.call('HSET', KEYS[2], 'limit', limit, id, cjson.encode({
    host = ARGV[5], pid = tonumber(ARGV[6]) or ARGV[6], thread = ARGV[7], caller = ARGV[8],
    acquired_at = now}))
  keep()
  return {1}
end

-- With held >= limit, the (held - limit + 1)-th lease to end frees a permit.
local nth = redis.call('ZRANGE', KEYS[1], held - limit, held - limit, 'WITHSCORES')
local wait = tonumber(nth[2]) - now + 1
if patience >= 0 and patience < wait then
  wait = patience
end
if patience ~= 0 then
  if now + wait > tonumber(redis.call('HGET', KEYS[2], 'waiting') or 0) then
    redis.call('HSET', KEYS[2], 'waiting', now + wait)
  end
  keep()
end
return {0, wait}
