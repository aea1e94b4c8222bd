-- Periodic schedules, prepended to scripts that say "--@include cron". Needs: common.

-- A schedule's metadata (a table), or nil when there is none or it cannot be decoded.
local function dq_cron_meta(key, name)
  local raw = redis.call('HGET', key, name)
  if not raw then return nil end
  local ok, m = pcall(cjson.decode, raw)
  if not ok or type(m) ~= 'table' then return nil end
  if type(m.running) ~= 'table' then m.running = {} end
  return m
end

local function dq_cron_save(key, name, m)
  redis.call('HSET', key, name, cjson.encode(m))
end

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

-- Remove an occurrence that is still waiting (a running one is left to finish).
-- k holds scheduled, tasks, attempts, errors and stats.
local function dq_cron_cancel(k, id)
  if redis.call('ZREM', k.scheduled, id) == 0 then return false end
  dq_forget(k, {id})
  redis.call('HINCRBY', k.stats, 'cancelled', 1)
  return true
end
