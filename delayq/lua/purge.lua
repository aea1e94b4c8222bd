-- purge: delete dead tasks for good.
-- KEYS[1] dead
-- KEYS[2] tasks
-- KEYS[3] errors
-- KEYS[4] attempts
-- KEYS[5] xkeys
-- ARGV[1] before_ms  with no ids: only tasks that died before this time ("" = any time)
-- ARGV[2] limit      with no ids: at most this many per call (the caller repeats)
-- ARGV[3...] ids     the tasks to purge; none means the oldest dead tasks
-- REPLY count
-- Returns: the number of tasks purged.
--@include forget
--@include unwatch
local ids = {}
for i = REST, #ARGV do ids[#ids + 1] = ARGV[i] end
if #ids == 0 then
  local before = '+inf'
  if A.before_ms ~= '' then before = '(' .. A.before_ms end
  ids = redis.call('ZRANGEBYSCORE', K.dead, '-inf', before, 'LIMIT', 0, tonumber(A.limit))
end
local n = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', K.dead, id) == 1 then
    dq_forget(K, {id})
    dq_unwatch(K, {id})
    n = n + 1
  end
end
return n
