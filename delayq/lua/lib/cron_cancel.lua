--@include forget

-- Remove an occurrence that is still waiting (a running one is left to finish).
-- k holds scheduled, tasks, attempts, errors and stats.
local function dq_cron_cancel(k, id)
  if redis.call('ZREM', k.scheduled, id) == 0 then return false end
  dq_forget(k, {id})
  redis.call('HINCRBY', k.stats, 'cancelled', 1)
  return true
end
