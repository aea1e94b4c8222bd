local K = {scheduled = KEYS[1]}
local A = {now = ARGV[1], channel = ARGV[2], id = ARGV[3], due = ARGV[4], reply = ARGV[5]}
local REST = 6
-- reschedule: move a waiting task to a new due time.
-- KEYS[1] scheduled
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] channel    wake-up channel
-- ARGV[3] id
-- ARGV[4] due        "+ms" from now, or absolute ms
-- ARGV[5] reply      (protocol 1.1) "now": reply {moved, now}; absent or "": moved alone (1.0)
-- REPLY moved | {moved, now}
-- Returns: moved: 1 if the task was waiting and moved, else 0 (running, finished, dead or
--          unknown). now: the now the call ran at, ms: a task moved is stored due at now + ms
--          for a due "+ms", at the number sent otherwise (lib/due.lua).
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
dq_wake(A.channel, old_head, due)
return with_now and {1, now} or 1
