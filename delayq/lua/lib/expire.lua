--@include attempt

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
