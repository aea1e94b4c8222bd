-- cancel: remove a waiting task. A running, finished or dead task is left as it is.
-- KEYS[1] scheduled
-- KEYS[2] tasks
-- KEYS[3] errors
-- KEYS[4] stats
-- KEYS[5] attempts
-- KEYS[6] xkeys
-- KEYS[7] waits
-- ARGV[1] id
-- ARGV[2] finished  the finished channel (protocol 1.1): told if someone waits for the id
-- REPLY cancelled
-- Returns: 1 if the task was waiting and is now gone, else 0.
--@include announce
--@include forget
--@include unwatch
if redis.call('ZREM', K.scheduled, A.id) == 0 then return 0 end
dq_forget(K, {A.id})
dq_unwatch(K, {A.id})
redis.call('HINCRBY', K.stats, 'cancelled', 1)
if A.finished and A.finished ~= '' then dq_announce(K, A.finished, {A.id}, nil) end
return 1
