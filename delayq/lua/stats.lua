-- stats: counts per state, the head of the schedule and the counters (read-only).
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] dead
-- KEYS[4] done
-- KEYS[5] stats
-- KEYS[6] expiry
-- KEYS[7] aborted
-- ARGV[1] now        ms, or "" for the server's TIME
-- REPLY {now, scheduled, due, active, dead, done, head_due, next_lease, expiry_mode, aborted} then per counter {name, value}
-- Returns: {now, scheduled, due, active, dead, done, head_due (-1: none),
--           next_lease_deadline (-1: none), expiry watcher mode ("" if none), aborted,
--           counter name, value, ...}
--@include clock
--@include head
local now = dq_now(A.now)
local out = {
  now,
  redis.call('ZCARD', K.scheduled),
  redis.call('ZCOUNT', K.scheduled, '-inf', now),
  redis.call('ZCARD', K.active),
  redis.call('ZCARD', K.dead),
  redis.call('ZCARD', K.done),
  dq_head(K.scheduled) or -1,
  -1,
  redis.call('HGET', K.expiry, 'mode') or '',
  redis.call('ZCARD', K.aborted),
}
local lease = redis.call('ZRANGE', K.active, 0, 0, 'WITHSCORES')
if lease[2] then out[8] = tonumber(lease[2]) end
local counters = redis.call('HGETALL', K.stats)
for i = 1, #counters do out[#out + 1] = counters[i] end
return out
