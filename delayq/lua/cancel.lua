-- cancel: remove a waiting task. A running, finished or dead task is left as it is. The
-- cancel is remembered for the dedupe window by a tombstone, the id and the time in the
-- cancelled set, with no record: get answers "cancelled", and the id may be scheduled again
-- at once (a schedule finds no record, so takes it for a new id, whatever its version).
-- KEYS[1] scheduled
-- KEYS[2] tasks
-- KEYS[3] errors
-- KEYS[4] stats
-- KEYS[5] attempts
-- KEYS[6] xkeys
-- KEYS[7] cancelled
-- KEYS[8] prio
-- KEYS[9] waits
-- ARGV[1] id
-- ARGV[2] now         ms, or "" for the server's TIME
-- ARGV[3] dedupe_ms   keep the tombstone this long (0: none)
-- ARGV[4] trim_limit  forget at most this many tombstones whose window has passed
-- ARGV[5] finished    the finished channel: told if someone waits for the id
-- REPLY cancelled
-- Returns: 1 if the task was waiting and is now gone, else 0.
--@include announce
--@include clock
--@include forget
--@include trim_tombstones
--@include unwatch
-- Called with 1.0's KEYS and ARGV (no cancelled key, no dedupe_ms): no tombstone, as then;
-- without the waits key or the finished channel, nobody is told.
local tombstones = K.cancelled
local now = dq_now(A.now)
local dedupe = tonumber(A.dedupe_ms) or 0
local cancelled = 0
if redis.call('ZREM', K.scheduled, A.id) == 1 then
  dq_forget(K, {A.id})
  dq_unwatch(K, {A.id})
  if K.prio then redis.call('ZREM', K.prio, A.id) end
  redis.call('HINCRBY', K.stats, 'cancelled', 1)
  if tombstones and dedupe > 0 then redis.call('ZADD', tombstones, now, A.id) end
  cancelled = 1
  if K.waits and A.finished and A.finished ~= '' then dq_announce(K, A.finished, {A.id}, nil) end
end
-- Forget tombstones whose dedupe window has passed, a few per call (as abort does its set).
if tombstones then dq_trim_tombstones(tombstones, now - dedupe, tonumber(A.trim_limit) or 0) end
return cancelled
