-- replay: move dead tasks back to the scheduled set, due now, with a fresh attempt budget.
-- KEYS[1] scheduled
-- KEYS[2] dead
-- KEYS[3] tasks
-- KEYS[4] stats
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] channel    wake-up channel
-- ARGV[3] limit      with no ids: replay at most this many, oldest first
-- ARGV[4...] ids     the tasks to replay; none means the oldest dead tasks
-- Returns: the number of tasks replayed. The last error is kept for the record.
--@include common
local now = dq_now(A.now)
local ids = {}
for i = REST, #ARGV do ids[#ids + 1] = ARGV[i] end
if #ids == 0 then
  ids = redis.call('ZRANGE', K.dead, 0, tonumber(A.limit) - 1)
end
local old_head = dq_head(K.scheduled)
local n = 0
for _, id in ipairs(ids) do
  local rec = redis.call('ZSCORE', K.dead, id) and redis.call('HGET', K.tasks, id)
  local h, payload, new = nil, nil, nil
  if rec then h, payload = dq_split(rec) end
  if h then
    h.a = 0
    new = dq_join(h, payload)
  end
  -- Nothing runnable to replay stays dead, evidence intact.
  if new then
    redis.call('ZREM', K.dead, id)
    redis.call('HSET', K.tasks, id, new)
    redis.call('ZADD', K.scheduled, now, id)
    n = n + 1
  end
end
if n > 0 then
  redis.call('HINCRBY', K.stats, 'replayed', n)
  dq_wake(A.channel, old_head, now)
end
return n
