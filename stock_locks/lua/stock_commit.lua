-- Make a reservation final: its units stay sold, a later release restores nothing.
--
-- KEYS[1] the order's reservation record   KEYS[2] index of open records
-- ARGV[1] order ref
-- Returns 1 when a record was closed, 0 when there was none.
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('DEL', KEYS[1])
