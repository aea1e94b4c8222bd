-- Workers register on claims and heartbeats (no extra command for an idle worker). An
-- unchanged registration ("" info) only refreshes the time seen, one write; a full one also
-- drops entries not seen for a day, a few per call.
local function dq_register(k, id, info, now)
  if id == '' then return end
  redis.call('ZADD', k.workers_seen, now, id)
  if info == '' then return end
  redis.call('HSET', k.workers, id, info)
  local old = redis.call('ZRANGEBYSCORE', k.workers_seen, '-inf', now - 86400000, 'LIMIT', 0, 5)
  if #old > 0 then
    redis.call('ZREM', k.workers_seen, unpack(old))
    redis.call('HDEL', k.workers, unpack(old))
  end
end
