-- reschedule: move a waiting task to a new due time.
-- KEYS[1] scheduled
-- KEYS[2] prio
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] channel    wake-up channel
-- ARGV[3] id
-- ARGV[4] due        "+ms" from now, or absolute ms
-- ARGV[5] reply      (protocol 1.1) "now": reply {moved, now}; absent or "": moved alone (1.0)
-- REPLY moved | {moved, now}
-- Returns: moved: 1 if the task was waiting and moved, else 0 (running, finished, dead or
--          unknown). now: the now the call ran at, ms: a task moved is stored due at now + ms
--          for a due "+ms", at the number sent otherwise (lib/due.lua).
-- A task with a priority keeps it: its entry in the prio index (lib/prio.lua) moves too.
-- (A 1.0 reschedule leaves the entry: claim repairs it, see dq_prio_due.)
--@include clock
--@include due
--@include head
--@include prio
--@include prio_level
--@include wake
local now = dq_now(A.now)
local with_now = A.reply == 'now'
if not redis.call('ZSCORE', K.scheduled, A.id) then return with_now and {0, now} or 0 end
local old_head = dq_head(K.scheduled)
local due = dq_due(A.due, now)
redis.call('ZADD', K.scheduled, 'XX', due, A.id)
local score = redis.call('ZSCORE', K.prio, A.id)
if score then
  redis.call('ZADD', K.prio, dq_prio_score(dq_prio_level(tonumber(score)), due), A.id)
end
dq_wake(A.channel, old_head, due)
return with_now and {1, now} or 1
