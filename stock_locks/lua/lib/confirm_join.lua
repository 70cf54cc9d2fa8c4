-- Shared by stock_confirm_join.lua and stock_reserve.lua, included where this line
-- stands in them: "-- include lib/confirm_join.lua" (stock_locks/scripts.py).
-- Defines the local function confirm_join(queue, leader, job, token, lease_ms,
-- wait_ms, now_ms); expects nothing of the including script.
--
-- Join the database confirmations of reservations Redis took (group commit,
-- stock_locks.stock.groupcommit). When no one leads, the caller leads from now
-- (returns 1) and writes its own reservation alone. Else the job is queued as
-- "<deadline ms> <now ms> <job>" (deadline: now plus the caller's wait, on this
-- server's clock) and that entry is returned, for the caller to take back should
-- it stop waiting.
local function confirm_join(queue, leader, job, token, lease_ms, wait_ms, now_ms)
  if redis.call('SET', leader, token, 'NX', 'PX', lease_ms) then
    return 1
  end
  local entry = string.format('%d %d %s', now_ms + tonumber(wait_ms), now_ms, job)
  redis.call('RPUSH', queue, entry)
  return entry
end
