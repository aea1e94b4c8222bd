--@include error

-- A task moves to the dead set; the record and the reason stay for inspection and replay.
local function dq_bury(k, id, now, reason)
  redis.call('ZADD', k.dead, now, id)
  dq_set_error(k.errors, id, reason)
  redis.call('HINCRBY', k.stats, 'dead', 1)
end
