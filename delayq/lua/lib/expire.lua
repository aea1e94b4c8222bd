-- Watched keys' lifecycle (docs/expiring.md, "The lifecycle"), prepended to scripts that say
-- "--@include expire". Needs: common. A watched key's task has the id "x:<16 chars>:<key>"
-- (expiring.task_id_for), so the key is read back from the id, never built.

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

-- Drop a task that is still replaceable ('alive' or 'ahead'): a claim ahead is revoked, so the
-- worker that holds it finds its lease gone at the deadline and runs no callback.
local function dq_watch_drop(k, id)
  redis.call('ZREM', k.scheduled, id)
  redis.call('ZREM', k.active, id)
  dq_forget(k, {id})
end

-- A watched key's mapping goes with its task's record: called where records are forgotten
-- (ack's trimming, cancel, purge). Ids of other tasks are skipped. k holds xkeys.
local function dq_unwatch(k, ids)
  for _, id in ipairs(ids) do
    if string.sub(id, 1, 2) == 'x:' then
      local key = string.match(id, '^x:[^:]*:(.*)$')
      if key and redis.call('HGET', k.xkeys, key) == id then
        redis.call('HDEL', k.xkeys, key)
      end
    end
  end
end

-- Forget, a few per call, the tasks of a finished set (done, aborted) whose dedupe window
-- ended by upto: their set entries, records and watched keys' mappings.
local function dq_trim_finished(k, set, upto, limit)
  local old = redis.call('ZRANGEBYSCORE', set, '-inf', upto, 'LIMIT', 0, limit)
  if #old > 0 then
    redis.call('ZREM', set, unpack(old))
    dq_forget(k, old)
    dq_unwatch(k, old)
  end
end
