-- expire_set: record a watched key's deadline and value as a task that fires at that
-- deadline (step 1 of expiring.set; step 2 sets the key itself with PXAT the deadline).
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] tasks
-- KEYS[4] errors
-- KEYS[5] stats
-- KEYS[6] xkeys
-- KEYS[7] attempts
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] channel    wake-up channel
-- ARGV[3] key        the watched key
-- ARGV[4] id         id of the new task
-- ARGV[5] ttl_ms     time to live
-- ARGV[6] header     the record's header line, newline included
-- ARGV[7] value      the value, JSON-encoded
-- REPLY deadline
-- Returns: the deadline (ms, server clock).
-- The task of an earlier set is replaced only while its key has not expired ('alive', or
-- claimed ahead of its deadline: the claim is revoked). One whose key expired (waiting,
-- claimed, retrying) is left to deliver the value it carries.
--@include clock
--@include expire
--@include expire_drop
--@include head
--@include wake
local now = dq_now(A.now)
local deadline = now + tonumber(A.ttl_ms)
local old = redis.call('HGET', K.xkeys, A.key)
local state = dq_watch_state(K, old, now)
if state == 'alive' or state == 'ahead' then
  dq_watch_drop(K, old)
end
local old_head = dq_head(K.scheduled)
local payload = '{"k":' .. cjson.encode(A.key) .. ',"v":' .. A.value .. ',"d":' .. deadline .. '}'
redis.call('HSET', K.xkeys, A.key, A.id)
redis.call('HSET', K.tasks, A.id, A.header .. payload)
-- Redis counts a key as expired once its clock is past the deadline: the task is due 1 ms
-- after it, so the check that follows finds the key gone rather than re-arming for 1 ms.
redis.call('ZADD', K.scheduled, deadline + 1, A.id)
redis.call('HINCRBY', K.stats, 'scheduled', 1)
dq_wake(A.channel, old_head, deadline + 1)
return deadline
