--@include head
--@include wake

-- Create an occurrence unless its id is already known (deterministic ids: once, however many
-- workers try). k holds tasks, attempts, scheduled and stats. Returns true if it was created.
local function dq_cron_put(k, id, due, rec, channel)
  if redis.call('HSETNX', k.tasks, id, rec) == 0 then return false end
  redis.call('HDEL', k.attempts, id)  -- as in schedule.lua: a new task has no attempts yet
  local old_head = dq_head(k.scheduled)
  redis.call('ZADD', k.scheduled, due, id)
  redis.call('HINCRBY', k.stats, 'scheduled', 1)
  dq_wake(channel, old_head, due)
  return true
end
