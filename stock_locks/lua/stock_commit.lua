-- Make a reservation final: its units stay sold, a later release restores nothing.
--
-- KEYS[1] the order's reservation record   KEYS[2] index of open records
-- ARGV[1] order ref
-- Derived: KEYS[1] .. ':caps' (the caps it counts under; their usage entries stay:
-- paid units count against the customer's caps until their window passes).
-- Returns 1 when a record was closed, 0 when there was none.
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[1] .. ':caps')
return redis.call('DEL', KEYS[1])
