-- expire_confirm: a worker found a watched key gone (or alive) at its task's due time; before
-- it runs the callback, or re-arms the task, it asks whether the expiry is still its own.
-- KEYS[1] active
-- KEYS[2] tasks
-- KEYS[3] attempts
-- KEYS[4] xkeys
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] key        the watched key
-- ARGV[3] id         the task
-- ARGV[4] token      the lease token of this claim
-- REPLY {status, ms}
-- Returns: {status, ms}. status "lost": the lease is gone (a set, touch or delete before the
-- deadline revoked the claim ahead, or the lease expired): no callback. "early": the
-- deadline has not passed on the server's clock; ms is how long until it has. "current":
-- the key is still this task's. "moved": the key was set again after this expiry happened,
-- so a live key is the newer value's, not this one extended: deliver.
-- Once this has answered "current" or "moved", a set or delete finds the task past its
-- deadline and leaves it to deliver (the server runs scripts one at a time).
--@include attempt
--@include clock
--@include lease
local now = dq_now(A.now)
if not dq_held(K, {A.id}, {A.token}, now, false)[1] then return {'lost', 0} end
local _, _, due = dq_attempt(K, A.id)
if due and due > now then return {'early', due - now} end
if redis.call('HGET', K.xkeys, A.key) == A.id then return {'current', 0} end
return {'moved', 0}
