-- Periodic schedules: a schedule's metadata.

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
