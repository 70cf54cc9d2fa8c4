-- The group commit's leader, its batch written, answers that batch's callers and
-- passes the lead on: with the next batch, to the caller whose entry heads the
-- queue, or to no one when the queue is empty.
--
-- KEYS[1] queue   KEYS[2] leader   KEYS[3] reply list of the head's caller (any key
-- when the leader names no head)   KEYS[4..] reply lists of the callers answered
-- ARGV[1] leader's token   ARGV[2] lease ms   ARGV[3] most entries in a batch
-- ARGV[4] the head entry the leader names ('' for none)   ARGV[5] next leader's token
-- ARGV[6] reply ttl ms   ARGV[7..] the answers, in the order of KEYS[4..]
-- Answers are delivered whatever else happens (they are what the database did).
-- Entries whose caller's deadline has passed are dropped (that caller writes its
-- own, or is gone). The next leader gets 'lead <token>\n<entry now heading the
-- queue, or empty>\n<entry>\n<entry>...', its own entry first. Returns
--   {-1}       the caller does not lead (its lease ran out): nothing else done
--   {0}        the queue is empty: no one leads now
--   {2}        the head's caller leads now
--   {3, head}  the head is not the entry named: nothing passed, name this one
for i = 4, #KEYS do
  redis.call('RPUSH', KEYS[i], ARGV[i + 3])
  redis.call('PEXPIRE', KEYS[i], ARGV[6])
end
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return {-1}
end
-- include lib/now.lua
local head = redis.call('LINDEX', KEYS[1], 0)
while head and tonumber(string.match(head, '^%d+')) <= now do
  redis.call('LPOP', KEYS[1])
  head = redis.call('LINDEX', KEYS[1], 0)
end
if not head then
  redis.call('DEL', KEYS[2])
  return {0}
end
if head ~= ARGV[4] then
  return {3, head}
end
local batch = redis.call('LPOP', KEYS[1], ARGV[3])
local next_head = redis.call('LINDEX', KEYS[1], 0) or ''
redis.call('SET', KEYS[2], ARGV[5], 'PX', ARGV[2])
redis.call('RPUSH', KEYS[3], 'lead ' .. ARGV[5] .. '\n' .. next_head .. '\n' .. table.concat(batch, '\n'))
redis.call('PEXPIRE', KEYS[3], ARGV[6])
return {2}
