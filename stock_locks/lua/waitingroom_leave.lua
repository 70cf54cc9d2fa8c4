-- A visitor leaves the waiting room (its order is paid, or it gave up): its slot, or its
-- place in the queue, is free at once. Safe to repeat.
--
-- KEYS[1] state hash   KEYS[2] visitors hash   KEYS[3] tickets hash   KEYS[4] polled zset
-- KEYS[5] active zset
-- ARGV[1] visitor id   ARGV[2] (optional, may be '') the ticket its pass names: that
--         ticket leaves, whoever the visitor is now (a guest who logged in since)
--
-- Returns 1 (it had a place or a slot) or 0 (nothing to free).
local ticket = ARGV[2]
if not ticket or ticket == '' or redis.call('HEXISTS', KEYS[3], ticket) == 0 then
  ticket = redis.call('HGET', KEYS[2], ARGV[1])
end
if not ticket then
  return 0
end
local info = redis.call('HGET', KEYS[3], ticket)
if info then
  local visitor = string.match(info, '^%d+:%d+:(.*)$')
  if redis.call('HGET', KEYS[2], visitor) == ticket then
    redis.call('HDEL', KEYS[2], visitor)
  end
end
if redis.call('HGET', KEYS[2], ARGV[1]) == ticket then
  redis.call('HDEL', KEYS[2], ARGV[1])
end
redis.call('HDEL', KEYS[3], ticket)
redis.call('ZREM', KEYS[4], ticket)
redis.call('ZREM', KEYS[5], ticket)
redis.call('HINCRBY', KEYS[1], 'left', 1)
return 1
