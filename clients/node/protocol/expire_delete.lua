local K = {scheduled = KEYS[1], active = KEYS[2], tasks = KEYS[3], errors = KEYS[4], stats = KEYS[5], xkeys = KEYS[6], attempts = KEYS[7]}
local A = {now = ARGV[1], key = ARGV[2]}
local REST = 3
-- expire_delete: stop watching a key (step 1 of expiring.delete; step 2 deletes the key).
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] tasks
-- KEYS[4] errors
-- KEYS[5] stats
-- KEYS[6] xkeys
-- KEYS[7] attempts
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] key        the watched key
-- REPLY cancelled
-- Returns: 1 if a waiting expiry was cancelled, else 0.
-- Only a key that has not expired is cancelled (waiting, or claimed ahead of its deadline:
-- the claim is revoked). An expiry that happened is still delivered, and a mapping stays
-- with its task's record (a bell about the key is then not taken for a foreign key's).
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
local now = dq_now(A.now)
local id = redis.call('HGET', K.xkeys, A.key)
local state = dq_watch_state(K, id, now)
if state == 'alive' or state == 'ahead' then
  dq_watch_drop(K, id)
  redis.call('HDEL', K.xkeys, A.key)
  redis.call('HINCRBY', K.stats, 'cancelled', 1)
  return 1
end
if id and state == 'none' then redis.call('HDEL', K.xkeys, A.key) end
return 0
