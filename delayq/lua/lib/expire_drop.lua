--@include forget

-- Drop a task that is still replaceable ('alive' or 'ahead'): a claim ahead is revoked, so the
-- worker that holds it finds its lease gone at the deadline and runs no callback.
local function dq_watch_drop(k, id)
  redis.call('ZREM', k.scheduled, id)
  redis.call('ZREM', k.active, id)
  dq_forget(k, {id})
end
