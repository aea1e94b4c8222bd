-- expire_touch: move a watched key's recorded deadline (step 1 of expiring.touch; step 2
-- is PEXPIREAT on the key).
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] tasks
-- KEYS[4] xkeys
-- KEYS[5] attempts
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] channel    wake-up channel
-- ARGV[3] key        the watched key
-- ARGV[4] ttl_ms     new time to live
-- REPLY deadline
-- Returns: the new deadline (ms), or -1 when the key is not watched or has expired.
-- Only a key that has not expired moves: a waiting task, or one claimed ahead of its
-- deadline (the claim is revoked and the task waits again, never attempted).
--@include clock
--@include expire
--@include head
--@include wake
local now = dq_now(A.now)
local id = redis.call('HGET', K.xkeys, A.key)
local state = dq_watch_state(K, id, now)
if state ~= 'alive' and state ~= 'ahead' then return -1 end
local deadline = now + tonumber(A.ttl_ms)
local rec = redis.call('HGET', K.tasks, id)
-- The recorded deadline is the payload's last field.
redis.call('HSET', K.tasks, id, (string.gsub(rec, ',"d":%d+}$', ',"d":' .. deadline .. '}')))
if state == 'ahead' then
  redis.call('ZREM', K.active, id)
  redis.call('HDEL', K.attempts, id)
end
local old_head = dq_head(K.scheduled)
redis.call('ZADD', K.scheduled, deadline + 1, id)  -- see expire/set.lua
dq_wake(A.channel, old_head, deadline + 1)
return deadline
