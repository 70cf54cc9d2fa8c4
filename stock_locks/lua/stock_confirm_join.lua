-- Join the database confirmations of reservations Redis took (group commit,
-- stock_locks.stock.groupcommit).
--
-- KEYS[1] queue of confirmations waiting for a leader   KEYS[2] leader (token, leased)
-- ARGV[1] the job   ARGV[2] token of this caller, should it lead   ARGV[3] lease ms
-- ARGV[4] how long the caller waits for an answer, ms
-- Returns {1} when no one led: the caller leads now and writes its own job alone.
-- Else {0, entry}: the job is queued as entry ("<deadline ms> <job>", the deadline
-- on this server's clock), for the caller to take back should it stop waiting.
if redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then
  return {1}
end
local now = redis.call('TIME')
local deadline = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + tonumber(ARGV[4])
local entry = string.format('%d %s', deadline, ARGV[1])
redis.call('RPUSH', KEYS[1], entry)
return {0, entry}
