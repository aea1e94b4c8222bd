-- reap: return tasks whose lease expired to the scheduled set (or the dead set when their
-- attempt limit is spent). Workers also reap at the start of every claim.
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] tasks
-- KEYS[4] dead
-- KEYS[5] errors
-- KEYS[6] stats
-- KEYS[7] attempts
-- KEYS[8] control
-- KEYS[9] prio
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] limit      at most this many leases
-- ARGV[3] channel    wake-up channel
-- REPLY count
-- Returns: the number of expired leases handled.
--@include clock
--@include head
--@include reap
--@include wake
local now = dq_now(A.now)
local old_head = dq_head(K.scheduled)
local n, first_due = dq_reap(K, now, tonumber(A.limit))
dq_wake(A.channel, old_head, first_due)
return n
