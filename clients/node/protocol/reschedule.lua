local K = {scheduled = KEYS[1], prio = KEYS[2]}
local A = {now = ARGV[1], channel = ARGV[2], id = ARGV[3], due = ARGV[4], reply = ARGV[5]}
local REST = 6
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
-- The one clock: the server's TIME in ms, unless the caller passes an explicit "now"
-- (tests run a script as of a given time).
local function dq_now(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- "+<ms>" is relative to now; anything else is an absolute ms timestamp.
local function dq_due(spec, now)
  if string.byte(spec) == 43 then return now + tonumber(string.sub(spec, 2)) end  -- '+'
  return tonumber(spec)
end
-- Earliest due time in the scheduled set, or false when it is empty.
local function dq_head(scheduled)
  local head = redis.call('ZRANGE', scheduled, 0, 0, 'WITHSCORES')
  if head[2] then return tonumber(head[2]) end
  return false
end
-- Priorities (docs/priorities.md): a waiting task scheduled with a priority 1-9 is in the
-- scheduled set as every task is, and also in the prio index, scored (10 - p) * PRIO_STEP +
-- due, so that each level is one range of scores, its tasks in due order. The control
-- hash's field "prio" is set while the index may hold tasks: claim reads it in the HMGET it
-- makes of the controls anyway, so a queue with no prioritised task pays no command for
-- priorities. The scheduled set stays the truth: claim repairs or drops an index entry
-- that disagrees with it (a task cancelled, or moved by a script that knows no index).

local PRIO_STEP = 1e13  -- ms: past year 2286; (10 - p) * PRIO_STEP + due stays below 2^53

-- A task's score in the index at level p (1-9), due at due (ms).
local function dq_prio_score(p, due)
  return (10 - p) * PRIO_STEP + due
end


-- The level (1-9) of a score in the prio index (lib/prio.lua).
local function dq_prio_level(score)
  return 10 - math.floor(score / PRIO_STEP)
end
-- Tell idle workers about a due time earlier than the head they know of.
local function dq_wake(channel, old_head, new_due)
  if new_due and (not old_head or new_due < old_head) then
    redis.call('PUBLISH', channel, tostring(new_due))
  end
end
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
