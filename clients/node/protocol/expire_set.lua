local K = {scheduled = KEYS[1], active = KEYS[2], tasks = KEYS[3], errors = KEYS[4], stats = KEYS[5], xkeys = KEYS[6], attempts = KEYS[7]}
local A = {now = ARGV[1], channel = ARGV[2], key = ARGV[3], id = ARGV[4], ttl_ms = ARGV[5], header = ARGV[6], value = ARGV[7]}
local REST = 8
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
-- The one clock: the server's TIME in ms, unless the caller passes an explicit "now"
-- (tests run a script as of a given time).
local function dq_now(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- A task's attempt state: the lease token, attempt number and due time of its current or
-- last claim, kept in the attempts hash as "<token> <attempt> <due>" apart from the record,
-- so that a claim writes these few bytes instead of rewriting the record. Only these
-- functions and those of lib/attempt_token.lua, attempt_count.lua and attempt_text.lua read
-- or write that text.
local function dq_attempt_parse(raw)
  local t, a, d = string.match(raw, '^(%d+) (%d+) ?(%S*)$')
  return tonumber(t) or 0, tonumber(a) or 0, tonumber(d)
end

-- One task's attempt state: token, attempt, due (see dq_attempt_parse); nil when it has
-- none (never claimed). k holds attempts.
local function dq_attempt(k, id)
  local raw = redis.call('HGET', k.attempts, id)
  if raw then return dq_attempt_parse(raw) end
  return nil
end

-- Watched keys' lifecycle (docs/expiring.md, "The lifecycle"). A watched key's task has the
-- id "x:<16 chars>:<key>" (expiring.task_id_for), so the key is read back from the id, never
-- built.

-- The state of a watched key's task id at now, as the table names it:
--   'alive'    waiting, never attempted, its due time (deadline + 1) still ahead
--   'ahead'    claimed on its first attempt ahead of its due time (the worker's lookahead)
--   'expired'  waiting, never attempted, due (its deadline passed, or the bell moved it)
--   'claimed'  held by a worker at or past its due time, or on a later attempt
--   'retrying' waiting after an attempt (failed, or its lease expired)
--   'finished' delivered (done) or died (dead): its record stays, so does the mapping
--   'none'     no task, or a mapping its record did not outlive
-- Only 'alive' and 'ahead' are still replaceable: the key has not expired. k holds scheduled,
-- active, tasks and attempts.
local function dq_watch_state(k, id, now)
  if not id then return 'none' end
  if redis.call('HEXISTS', k.tasks, id) == 0 then return 'none' end  -- 0 is true in Lua
  local due = redis.call('ZSCORE', k.scheduled, id)
  if due then
    local _, a = dq_attempt(k, id)
    if a and a > 0 then return 'retrying' end
    if tonumber(due) > now then return 'alive' end
    return 'expired'
  end
  if redis.call('ZSCORE', k.active, id) then
    local _, a, d = dq_attempt(k, id)
    if a == 1 and d and d > now then return 'ahead' end
    return 'claimed'
  end
  return 'finished'
end
-- Forget tasks: record, attempt state and last error. k holds tasks, attempts and errors.
local function dq_forget(k, ids)
  redis.call('HDEL', k.tasks, unpack(ids))
  redis.call('HDEL', k.attempts, unpack(ids))
  redis.call('HDEL', k.errors, unpack(ids))
end

-- Drop a task that is still replaceable ('alive' or 'ahead'): a claim ahead is revoked, so the
-- worker that holds it finds its lease gone at the deadline and runs no callback.
local function dq_watch_drop(k, id)
  redis.call('ZREM', k.scheduled, id)
  redis.call('ZREM', k.active, id)
  dq_forget(k, {id})
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
