-- An admitted visitor's pass is due for renewal: is its session still held?
--
-- KEYS[1] the room's state hash   KEYS[2] active zset (admitted ticket -> last request ms)
-- ARGV[1] the pass's ticket   ARGV[2] the pass's born (the state it was issued under)
-- ARGV[3] session_ttl (ms)
--
-- Returns 1 (held: its last request is now) or 0 (lapsed, left, or the state was lost
-- since the pass was issued: the visitor queues again).
-- include lib/now.lua
if redis.call('HGET', KEYS[1], 'born') ~= ARGV[2] then
  return 0
end
local seen = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not seen or tonumber(seen) < now - tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[2], now, ARGV[1])
return 1
