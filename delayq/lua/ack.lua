-- ack: record tasks as done, if the caller still holds their leases.
-- KEYS[1] active
-- KEYS[2] tasks
-- KEYS[3] done
-- KEYS[4] errors
-- KEYS[5] stats
-- ARGV[1] now         ms, or "" for the server's TIME
-- ARGV[2] dedupe_ms   keep the finished record this long (0: delete it now)
-- ARGV[3] counter     stats counter to add to: "succeeded" or "discarded"
-- ARGV[4] trim_limit  delete at most this many records whose dedupe window has passed
-- ARGV[5...] leases   pairs: id, lease token
-- Returns: the ids whose ack was refused because the lease was lost (expired or taken over).
--@include common
--@include lease
local now = dq_now(A.now)
local dedupe = tonumber(A.dedupe_ms)
local refused = {}
local acked = 0
for i = REST, #ARGV, 2 do
  local id = ARGV[i]
  if dq_holds(K, id, ARGV[i + 1], now) then
    redis.call('ZREM', K.active, id)
    if dedupe > 0 then
      redis.call('ZADD', K.done, now, id)
    else
      redis.call('HDEL', K.tasks, id)
      redis.call('HDEL', K.errors, id)
    end
    acked = acked + 1
  else
    refused[#refused + 1] = id
  end
end
if acked > 0 then redis.call('HINCRBY', K.stats, A.counter, acked) end

-- Forget finished records whose dedupe window has passed, a few per call.
local old = redis.call('ZRANGEBYSCORE', K.done, '-inf', now - dedupe, 'LIMIT', 0, tonumber(A.trim_limit))
for _, id in ipairs(old) do
  redis.call('ZREM', K.done, id)
  redis.call('HDEL', K.tasks, id)
  redis.call('HDEL', K.errors, id)
end
return refused
