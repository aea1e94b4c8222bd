-- reschedule: move a waiting task to a new due time.
-- KEYS[1] scheduled
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] channel    wake-up channel
-- ARGV[3] id
-- ARGV[4] due        "+ms" from now, or absolute ms
-- REPLY moved
-- Returns: 1 if the task was waiting and moved, else 0 (running, finished, dead or unknown).
--@include clock
--@include due
--@include head
--@include wake
if not redis.call('ZSCORE', K.scheduled, A.id) then return 0 end
local now = dq_now(A.now)
local old_head = dq_head(K.scheduled)
local due = dq_due(A.due, now)
redis.call('ZADD', K.scheduled, 'XX', due, A.id)
dq_wake(A.channel, old_head, due)
return 1
