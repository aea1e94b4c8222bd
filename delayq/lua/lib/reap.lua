--@include attempt
--@include bury
--@include error
--@include prio_of
--@include prio_put
--@include record

-- Return tasks whose lease expired (their worker died or stalled) to the scheduled set,
-- or to the dead set when the task's own attempt limit is spent. The attempt counts.
-- k holds active, scheduled, tasks, attempts, dead, errors, stats, control and prio: a task
-- with a priority goes back into the prio index.
-- Returns the number of leases reaped and the earliest due time it scheduled (or false).
local function dq_reap(k, now, limit)
  local ids = redis.call('ZRANGEBYSCORE', k.active, '-inf', now, 'LIMIT', 0, limit)
  local first_due = false
  for _, id in ipairs(ids) do
    redis.call('ZREM', k.active, id)
    local rec = redis.call('HGET', k.tasks, id)
    if rec then
      local h = dq_split(rec)
      local _, a = dq_attempt(k, id)
      if not a and h then a = 0 end  -- never claimed (an active task always was)
      local what = 'lease expired during attempt ' .. tostring(a or '?') ..
        ' (the worker stopped, crashed or stalled past its lease)'
      if h and h.m > 0 and a >= h.m then
        dq_bury(k, id, now, what .. '; no attempts left')
      else
        redis.call('ZADD', k.scheduled, now, id)
        local p = dq_prio_of(h)
        if p then dq_prio_put(k, id, p, now) end
        dq_set_error(k.errors, id, what)
        first_due = now
      end
    end
  end
  if #ids > 0 then redis.call('HINCRBY', k.stats, 'leases_expired', #ids) end
  return #ids, first_due
end
