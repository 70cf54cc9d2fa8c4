-- Admit a waiter of a fair semaphore in arrival order, or queue it.
--
-- KEYS[1] holders (zset: holder id -> when its lease ends, ms on the Redis clock)
-- KEYS[2] meta (hash: 'limit' and holder id -> JSON metadata)
-- KEYS[3] queue (zset: waiter id -> ticket, i.e. arrival order)
-- KEYS[4] alive (zset: waiter id -> when its place in the queue lapses, ms)
-- KEYS[5] ticket counter
-- KEYS[6] wake-up prefix, not a key: a waiter's own wake-up list is this prefix
--         followed by its id. Which waiters to wake is only known inside the
--         script, so their lists cannot be declared; the prefix is declared
--         instead, and it carries the semaphore's {hash tag}, so every list
--         built from it lives in this script's cluster slot.
-- KEYS[7] gone (zset: id -> until when it counts as given back, ms)
-- ARGV[1] id   ARGV[2] limit   ARGV[3] lease in ms
-- ARGV[4] the longest the caller will wait before its next try, ms
--         (-1: no bound of its own; 0: last try: refused means leave the queue)
-- ARGV[5] grace, ms: how long past its planned next try a waiter keeps its
--         place, and how long an unclaimed wake-up lasts. A place lapses at
--         (planned next try + grace), so the planned try is read back from it:
--         every caller must pass the same grace.
-- ARGV[6] host  ARGV[7] pid  ARGV[8] thread  ARGV[9] caller
--
-- Ended leases and lapsed places are removed first. A waiter is admitted when
-- its rank in the queue is below the number of free permits (limit - holders):
-- nobody behind can take a permit while someone ahead still waits. A caller
-- that is not queued is admitted if it would be, and otherwise takes a ticket
-- (INCR: the server decides the order) and joins the queue, once: later tries
-- keep its ticket.
-- Whatever changed (a grant, a place taken or left, an ended lease or a lapsed
-- place removed), each waiter among the first `limit` in line whose turn can
-- now come sooner than its planned next try is woken to try again (see
-- wake_due), so a permit freed by an ended lease goes to the next waiter when
-- that lease ends, whoever was ahead of it meanwhile.
-- Returns {2}, changing nothing, when the id was given back (see
-- fair_release.lua): this call is a late copy of a try whose caller moved on.
-- Returns {1} when granted, also when the id already holds a permit (its lease
-- is renewed), so a retried call whose reply was lost gets the same answer.
-- Returns {0, wait, rank, ticket} when queued at rank (0 = head): sleep until
-- woken or for wait ms, the soonest this waiter's turn can come without a
-- wake-up (the lease end that would free its permit, or the lapse of the place
-- just ahead of it), cut to ARGV[4].
-- Returns {0, 0, -1, 0} when refused on a last try; the caller is not queued.
-- include lib/now.lua
local holders, meta, queue, alive, tickets, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local gone = KEYS[7]
local id, limit, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local patience, grace = tonumber(ARGV[4]), tonumber(ARGV[5])

if tonumber(redis.call('ZSCORE', gone, id) or 0) > now then
  return {2}
end

-- include lib/fair_queue.lua

-- Every key lives until the last lease ends or the last place lapses, so an
-- abandoned semaphore vanishes by itself. The ticket counter lives as long as
-- the queue: were it reset under queued waiters, newcomers would jump ahead.
local function keep()
  local last = now
  for _, key in ipairs({holders, alive}) do
    local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if top[2] and tonumber(top[2]) > last then
      last = tonumber(top[2])
    end
  end
  if last > now then
    for _, key in ipairs({holders, meta, queue, alive, tickets}) do
      redis.call('PEXPIRE', key, last - now)
    end
  else
    redis.call('DEL', meta, tickets)
  end
end

local function leave()
  redis.call('ZREM', queue, id)
  redis.call('ZREM', alive, id)
  redis.call('DEL', wake .. id)
end

sweep()

if redis.call('ZSCORE', holders, id) then
  redis.call('ZADD', holders, now + lease, id)
  wake_due()
  keep()
  return {1}
end
local free = limit - redis.call('ZCARD', holders)
local ticket = redis.call('ZSCORE', queue, id)
local rank
if ticket then
  rank = redis.call('ZRANK', queue, id)
else
  rank = redis.call('ZCARD', queue)  -- the place it would take
end
if rank < free then
  leave()
  redis.call('ZADD', holders, now + lease, id)
  redis.call('HSET', meta, 'limit', limit, id, cjson.encode({
    host = ARGV[6], pid = tonumber(ARGV[7]) or ARGV[7], thread = ARGV[8], caller = ARGV[9],
    acquired_at = now}))
  wake_due()
  keep()
  return {1}
end
if patience == 0 then
  if ticket then
    leave()
  end
  wake_due()
  keep()
  return {0, 0, -1, 0}
end
if not ticket then
  ticket = redis.call('INCR', tickets)
  redis.call('ZADD', queue, ticket, id)
end

-- Without a wake-up, this waiter's turn can come when enough leases end to free
-- (rank + 1 - free) permits (their holders died), or when the place just ahead
-- lapses (its waiter died: this waiter's next try clears it).
local wait
local nth = redis.call('ZRANGE', holders, rank - free, rank - free, 'WITHSCORES')
if nth[2] then
  wait = tonumber(nth[2]) - now + 1
end
if rank > 0 then
  local ahead = redis.call('ZRANGE', queue, rank - 1, rank - 1)[1]
  local lapse = redis.call('ZSCORE', alive, ahead)
  if lapse and (not wait or tonumber(lapse) - now + 1 < wait) then
    wait = tonumber(lapse) - now + 1
  end
end
if patience > 0 and (not wait or patience < wait) then
  wait = patience
end
wait = wait or lease  -- only when limit differs between callers; a bound all the same
redis.call('ZADD', alive, now + wait + grace, id)
wake_due()
keep()
return {0, wait, rank, tonumber(ticket)}
