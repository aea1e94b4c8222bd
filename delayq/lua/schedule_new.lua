-- schedule_new: add one task whose id the producer has just made (a random id, never sent
-- before unless this is a resend of the same call): schedule.lua's common case, one
-- schedule() with no task_id, in the fewest commands.
-- KEYS[1] scheduled
-- KEYS[2] tasks
-- KEYS[3] stats
-- ARGV[1] now      ms, or "" for the server's TIME
-- ARGV[2] channel  wake-up channel
-- ARGV[3] id       the new id
-- ARGV[4] due      "+ms" from now, or absolute ms
-- ARGV[5] record   the task's record
-- REPLY {status, now}
-- Returns: status 1 created; 0 unchanged: the id has a record already, which for a new id
--          means the call was sent before (a resend after a dropped connection) and wrote
--          the task. now: the now the call ran at, ms (created: stored due at now + ms for a
--          due "+ms", at the number sent otherwise, as schedule.lua).
--
-- What schedule.lua does for a task that is new to the queue, and nothing else: no id of
-- an earlier task can be this one, so there is no state to look at and no attempts entry
-- to clear (schedule.lua clears one for a known id that an earlier version left behind).
-- A task id the caller chose, replace=True and durable=True go to schedule.lua.
--@include clock
--@include due
--@include head
--@include wake
local now = dq_now(A.now)
local due = dq_due(A.due, now)
if redis.call('HSETNX', K.tasks, A.id, A.record) == 0 then return {0, now} end
local old_head = dq_head(K.scheduled)
redis.call('ZADD', K.scheduled, due, A.id)
redis.call('HINCRBY', K.stats, 'scheduled', 1)
dq_wake(A.channel, old_head, due)
return {1, now}
