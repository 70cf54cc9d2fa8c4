-- Join the group commit for a reservation Redis took (see lib/confirm_join.lua); the
-- lua strategy does this inside stock_reserve.lua instead.
--
-- KEYS[1] queue of confirmations waiting for a leader   KEYS[2] leader (token, leased)
-- ARGV[1] the job   ARGV[2] token of this caller, should it lead   ARGV[3] lease ms
-- ARGV[4] how long the caller waits for an answer, ms
-- Returns {1} (the caller leads and writes its own) or {0, entry} (queued).
-- include lib/confirm_join.lua
-- include lib/now.lua
local joined = confirm_join(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], now)
if joined == 1 then
  return {1}
end
return {0, joined}
