-- A visitor leaves the waiting room (its order is paid, or it gave up): its slot, or
-- its place in the queue, is free at once. Safe to repeat.
--
-- KEYS[1] state hash   KEYS[2] visitors hash   KEYS[3] tickets hash   KEYS[4] polled zset
-- KEYS[5] active zset
-- ARGV[1] visitor id
--
-- Returns 1 (it had a place or a slot) or 0 (nothing to free).
local ticket = redis.call('HGET', KEYS[2], ARGV[1])
if not ticket then
  return 0
end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ticket)
redis.call('ZREM', KEYS[4], ticket)
redis.call('ZREM', KEYS[5], ticket)
redis.call('HINCRBY', KEYS[1], 'left', 1)
return 1
