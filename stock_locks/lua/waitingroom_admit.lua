-- One admission step of a waiting room, for a process that admits on its own (a
-- Celery beat task, a benchmark): lapsed sessions go, the pre-queue is drawn once the
-- sale started, and visitors are admitted within the limits (lib/waitingroom.lua).
-- Safe from every process at once; a repeated call is one more step within the limits.
--
-- KEYS as in lib/waitingroom.lua.
-- ARGV[1] the sale starts (ms)   ARGV[2] max active   ARGV[3] admissions per minute
-- ARGV[4] stock factor   ARGV[5] units left (-1: no limit)   ARGV[6] queue_ttl (ms)
-- ARGV[7] session_ttl (ms)   ARGV[8] hold when this call makes the state after the start (ms; 0 for none)   ARGV[9] most list
-- entries one step takes
--
-- Returns {admitted, born}: the number of visitors this step admitted, and when the
-- room's state was made (ms).
-- include lib/now.lua
-- include lib/waitingroom.lua
local start = tonumber(ARGV[1])
draw(start, tonumber(ARGV[8]))
local admitted = step(start, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]),
                      tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[9]))
return {admitted, tonumber(redis.call('HGET', state, 'born'))}
