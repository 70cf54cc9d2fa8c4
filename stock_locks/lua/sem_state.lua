#!lua flags=no-writes
-- Read a semaphore as the Redis clock sees it: for holders() and the admin page.
--
-- KEYS[1] holders (zset: holder id -> when its lease ends, ms)
-- KEYS[2] meta (hash: 'limit' and holder id -> JSON metadata)
-- KEYS[3] queue (zset: a fair semaphore's waiters; missing for a plain one)
--
-- Returns {now ms, limit or nil, queue length, {id, ms left, metadata, ...}}
-- with only the holders whose lease has not ended, soonest lease end first.
-- Changes nothing.
-- include lib/now.lua
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
local holders = {}
for i = 1, #live, 2 do
  holders[#holders + 1] = live[i]
  holders[#holders + 1] = tonumber(live[i + 1]) - now
  holders[#holders + 1] = redis.call('HGET', KEYS[2], live[i])
end
return {now, redis.call('HGET', KEYS[2], 'limit'), redis.call('ZCARD', KEYS[3]), holders}
