-- expire_touch: move a watched key's recorded deadline (step 1 of expiring.touch; step 2
-- is PEXPIREAT on the key).
-- KEYS[1] scheduled
-- KEYS[2] tasks
-- KEYS[3] xkeys
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] channel    wake-up channel
-- ARGV[3] key        the watched key
-- ARGV[4] ttl_ms     new time to live
-- Returns: the new deadline (ms), or -1 when the key is not watched or already firing.
--@include common
local id = redis.call('HGET', K.xkeys, A.key)
if not id or not redis.call('ZSCORE', K.scheduled, id) then return -1 end
local now = dq_now(A.now)
local deadline = now + tonumber(A.ttl_ms)
local rec = redis.call('HGET', K.tasks, id)
if rec then
  -- The recorded deadline is the payload's last field.
  redis.call('HSET', K.tasks, id, (string.gsub(rec, ',"d":%d+}$', ',"d":' .. deadline .. '}')))
end
local old_head = dq_head(K.scheduled)
redis.call('ZADD', K.scheduled, 'XX', deadline + 1, id)  -- see expire_set.lua
dq_wake(A.channel, old_head, deadline + 1)
return deadline
