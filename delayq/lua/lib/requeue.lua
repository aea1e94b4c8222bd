-- Move a leased task back to the scheduled set. Returns the earlier of due and min_due,
-- so a batch can announce its earliest due time once.
local function dq_requeue(k, id, due, min_due)
  redis.call('ZREM', k.active, id)
  redis.call('ZADD', k.scheduled, due, id)
  if not min_due or due < min_due then return due end
  return min_due
end
