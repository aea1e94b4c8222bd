--@include prio

-- Index a waiting task at level p (1-9) due at due, and mark the shard as having one.
local function dq_prio_put(k, id, p, due)
  redis.call('ZADD', k.prio, dq_prio_score(p, due), id)
  redis.call('HSET', k.control, 'prio', '1')
end
