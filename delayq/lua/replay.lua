-- replay: move dead tasks back to the scheduled set, due now, with a fresh attempt budget.
-- KEYS[1] scheduled
-- KEYS[2] dead
-- KEYS[3] tasks
-- KEYS[4] stats
-- KEYS[5] attempts
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] channel    wake-up channel
-- ARGV[3] limit      with no ids: replay at most this many, oldest first
-- ARGV[4...] ids     the tasks to replay; none means the oldest dead tasks
-- REPLY count
-- Returns: the number of tasks replayed. The last error is kept for the record.
--@include attempt
--@include attempt_text
--@include clock
--@include head
--@include record
--@include time_text
--@include wake
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
  -- Nothing runnable to replay stays dead, evidence intact.
  local h = rec and dq_split(rec)
  if h then
    local t, _, d = dq_attempt(K, id)
    redis.call('ZREM', K.dead, id)
    redis.call('HSET', K.attempts, id, dq_attempt_text(t or 0, 0, d and dq_ms(d) or ''))
    redis.call('ZADD', K.scheduled, now, id)
    n = n + 1
  end
end
if n > 0 then
  redis.call('HINCRBY', K.stats, 'replayed', n)
  dq_wake(A.channel, old_head, now)
end
return n
