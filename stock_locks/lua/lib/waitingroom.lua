-- Shared by the waiting-room scripts (waitingroom_visit.lua, waitingroom_admit.lua),
-- included where the line "-- include lib/waitingroom.lua" stands (stock_locks/scripts.py).
-- Expects the local `now` (ms, lib/now.lua) and the key layout below; defines the
-- local functions forget(), draw(), step() and position().
--
-- KEYS[1] state hash: born (ms the room's state was made), hold_until (ms), opened
--         (1 once the pre-queue was drawn), seq (last ticket), pushed<i>/popped<i>
--         (places handed out / taken off lane i), tokens + refill_at (the admission
--         bucket), advanced (places taken off every lane), m_t0/m_n0/m_a0 and m_t1/m_n1/
--         m_a1 (the rate meter: two window starts, `advanced` and `admitted` then),
--         admitted, abandoned_waiting,
--         abandoned_admitted, left, sold_out (counters and flags for operators)
-- KEYS[2] visitors hash: visitor id -> ticket
-- KEYS[3] tickets hash: ticket -> "<lane>:<place>:<visitor id>" (place 0: pre-queued)
-- KEYS[4] polled zset: waiting ticket -> its last poll (ms)
-- KEYS[5] active zset: admitted ticket -> its last request (ms)
-- KEYS[6..n+5] each lane's list of tickets, first lane first (the highest priority)
-- KEYS[n+6..2n+5] each lane's pre-queue set
-- KEYS[2n+6] the admission log: a list of the latest tickets admitted, oldest first
-- Every key carries the event's hash tag (stock_locks/keys.py, WaitingRoomKeys).
local state, visitors, tickets, polled, active = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local lanes = (#KEYS - 6) / 2
local admission_log = KEYS[#KEYS]
local LOG_SIZE = 10000  -- tickets the admission log keeps

-- The ticket's visitor no longer has a place: its records go (its list entry, if any,
-- is skipped when it reaches the head).
local function forget(ticket)
  local info = redis.call('HGET', tickets, ticket)
  if info then
    local visitor = string.match(info, '^%d+:%d+:(.*)$')
    if redis.call('HGET', visitors, visitor) == ticket then
      redis.call('HDEL', visitors, visitor)
    end
    redis.call('HDEL', tickets, ticket)
  end
end

-- Once the sale started: the pre-queue of each lane goes to the end of its list in a
-- random order (SPOP picks at random), once, whoever runs this first. `hold_ms`: a state
-- made now, after the start, admits nobody for that long (the caller's process saw the
-- room before: Redis lost its state, and passes issued before must lapse first).
local function draw(start, hold_ms)
  if redis.call('HSETNX', state, 'born', now) == 1 then
    local hold = 0
    if now >= start then
      hold = now + hold_ms
    end
    redis.call('HSET', state, 'hold_until', hold)
  end
  if now < start or redis.call('HGET', state, 'opened') == '1' then
    return
  end
  for lane = 1, lanes do
    while true do
      local ticket = redis.call('SPOP', KEYS[lanes + 5 + lane])
      if not ticket then
        break
      end
      local info = redis.call('HGET', tickets, ticket)
      if info then
        local place = redis.call('HINCRBY', state, 'pushed' .. lane, 1)
        redis.call('RPUSH', KEYS[5 + lane], ticket)
        redis.call('HSET', tickets, ticket,
                   lane .. ':' .. place .. string.match(info, '^%d+:%d+(:.*)$'))
      end
    end
  end
  redis.call('HSET', state, 'opened', 1)
end

-- One admission step: lapsed admitted visitors go, then visitors are taken from the
-- head of the highest non-empty lane while fewer than the limit are admitted and the
-- bucket has a token. A head whose last poll is older than queue_ttl_ms is dropped.
-- `remaining`: units left to sell (-1: no stock limit). Returns the number admitted.
local function step(start, max_active, per_minute, factor, remaining, queue_ttl_ms,
                    session_ttl_ms, max_pops)
  local lapsed = redis.call('ZRANGEBYSCORE', active, '-inf', now - session_ttl_ms,
                            'LIMIT', 0, max_pops)
  for _, ticket in ipairs(lapsed) do
    redis.call('ZREM', active, ticket)
    forget(ticket)
  end
  if #lapsed > 0 then
    redis.call('HINCRBY', state, 'abandoned_admitted', #lapsed)
  end
  if now < start then
    return 0
  end
  redis.call('HSET', state, 'sold_out', remaining == 0 and 1 or 0)
  if remaining == 0 or now < tonumber(redis.call('HGET', state, 'hold_until') or 0) then
    return 0
  end
  local limit = max_active
  if remaining > 0 and math.floor(remaining * factor) < limit then
    limit = math.floor(remaining * factor)
  end
  local free = limit - redis.call('ZCARD', active)
  local bucket = redis.call('HMGET', state, 'tokens', 'refill_at')
  local size = math.max(1, math.ceil(per_minute / 60))
  local tokens = tonumber(bucket[1] or size)
  tokens = math.min(size, tokens + (now - tonumber(bucket[2] or now)) * per_minute / 60000)
  local admitted, pops, dropped = 0, 0, 0
  for lane = 1, lanes do
    while admitted < free and tokens >= 1 and pops < max_pops do
      local ticket = redis.call('LPOP', KEYS[5 + lane])
      if not ticket then
        break
      end
      pops = pops + 1
      redis.call('HINCRBY', state, 'popped' .. lane, 1)
      local seen = redis.call('ZSCORE', polled, ticket)
      if seen then
        redis.call('ZREM', polled, ticket)
      end
      if seen and tonumber(seen) >= now - queue_ttl_ms then
        redis.call('ZADD', active, now, ticket)
        redis.call('RPUSH', admission_log, ticket)
        admitted = admitted + 1
        tokens = tokens - 1
      else
        if seen then
          dropped = dropped + 1
        end
        forget(ticket)
      end
    end
  end
  if admitted > 0 then
    redis.call('LTRIM', admission_log, -LOG_SIZE, -1)
  end
  redis.call('HSET', state, 'tokens', tokens, 'refill_at', now)
  local advanced = redis.call('HINCRBY', state, 'advanced', pops)
  redis.call('HINCRBY', state, 'admitted', admitted)
  if dropped > 0 then
    redis.call('HINCRBY', state, 'abandoned_waiting', dropped)
  end
  local total = redis.call('HGET', state, 'admitted')
  local meter = redis.call('HMGET', state, 'm_t1', 'm_n1', 'm_a1')
  if not meter[1] then
    -- (From after this first step: its burst, a full bucket's worth, is no steady pace.)
    redis.call('HSET', state, 'm_t0', now, 'm_n0', advanced, 'm_a0', total,
               'm_t1', now, 'm_n1', advanced, 'm_a1', total)
  elseif now - tonumber(meter[1]) >= 10000 then
    redis.call('HSET', state, 'm_t0', meter[1], 'm_n0', meter[2], 'm_a0', meter[3],
               'm_t1', now, 'm_n1', advanced, 'm_a1', total)
  end
  return admitted
end

-- Places ahead of a waiting ticket in lane `lane` at place `place`: those before it in
-- its lane, and everyone waiting in the lanes above (dropped visitors not yet reached
-- included). Also the rate the heads advance at, in places per 1000 s (0: not measured).
local function position(lane, place)
  local counts = redis.call('HMGET', state, 'pushed' .. lane, 'popped' .. lane,
                            'advanced', 'm_t0', 'm_n0')
  local ahead = place - tonumber(counts[2] or 0) - 1
  for higher = 1, lane - 1 do
    local pair = redis.call('HMGET', state, 'pushed' .. higher, 'popped' .. higher)
    ahead = ahead + tonumber(pair[1] or 0) - tonumber(pair[2] or 0)
  end
  local rate = 0
  if counts[4] and now - tonumber(counts[4]) >= 1000 then
    rate = math.floor((tonumber(counts[3] or 0) - tonumber(counts[5])) * 1000000
                      / (now - tonumber(counts[4])))
  end
  return ahead, rate
end
