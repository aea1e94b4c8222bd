-- move_tasks: tasks arriving on, or leaving, this shard while operate.reshard moves a queue
-- to another shard count (nothing else writes to the queue meanwhile: see reshard_mark).
-- KEYS[1] scheduled
-- KEYS[2] done
-- KEYS[3] tasks
-- KEYS[4] errors
-- KEYS[5] attempts
-- KEYS[6] aborted
-- KEYS[7] control
-- KEYS[8] prio
-- KEYS[9] kinds
-- ARGV[1] mode   "put": add the tasks to the set with their records; "drop": forget them
-- ARGV[2] state  "scheduled", "done" or "aborted": the set they are in
-- ARGV[3...] tasks  put: quintuples id, score, record (a tombstone as get replies it), last error ("": none), attempt
--                   state ("": none); drop: ids
-- REPLY count
-- Returns: how many tasks were put or dropped.
-- A waiting task with a priority (its record's "p") is indexed in prio (lib/prio.lua).
--@include forget
--@include prio_of
--@include prio_put
--@include record
--@include tombstone_store
if A.state ~= 'scheduled' and A.state ~= 'done' and A.state ~= 'aborted' then
  return redis.error_reply('move_tasks: unknown state ' .. tostring(A.state))
end
local set = K[A.state]
if A.mode == 'put' then
  local n, codes = 0, {}
  for i = REST, #ARGV - 4, 5 do
    local id = ARGV[i]
    redis.call('ZADD', set, ARGV[i + 1], id)
    redis.call('HSET', K.tasks, id, dq_tombstone_store(K, ARGV[i + 2], codes))
    if A.state == 'scheduled' then
      local p = dq_prio_of(dq_split(ARGV[i + 2]))
      if p then dq_prio_put(K, id, p, tonumber(ARGV[i + 1])) end
    end
    if ARGV[i + 3] ~= '' then
      redis.call('HSET', K.errors, id, ARGV[i + 3])
    else
      redis.call('HDEL', K.errors, id)
    end
    if ARGV[i + 4] ~= '' then
      redis.call('HSET', K.attempts, id, ARGV[i + 4])
    else
      redis.call('HDEL', K.attempts, id)
    end
    n = n + 1
  end
  return n
elseif A.mode == 'drop' then
  local ids = {}
  for i = REST, #ARGV do ids[#ids + 1] = ARGV[i] end
  if #ids == 0 then return 0 end
  redis.call('ZREM', set, unpack(ids))
  if A.state == 'scheduled' then redis.call('ZREM', K.prio, unpack(ids)) end
  dq_forget(K, ids)
  -- The shard's kinds' codes go with its last finished task (field by field: the documented
  -- least-privilege ACL user has no DEL).
  if redis.call('ZCARD', K.done) == 0 and redis.call('ZCARD', K.aborted) == 0 then
    local all, fields = redis.call('HGETALL', K.kinds), {}
    for i = 1, #all, 2 do fields[#fields + 1] = all[i] end
    if #fields > 0 then redis.call('HDEL', K.kinds, unpack(fields)) end
  end
  return #ids
end
return redis.error_reply('move_tasks: unknown mode ' .. tostring(A.mode))
