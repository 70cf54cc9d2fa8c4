-- Reset the lease of a lock held by a token.
--
-- KEYS[1] lock key   KEYS[2] holder hash
-- ARGV[1] token      ARGV[2] new lease in ms, counted from now
--
-- Returns 1 when extended, 0 when the token does not hold the lock.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
